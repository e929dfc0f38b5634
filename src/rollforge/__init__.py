"""rollforge: multi-turn rollouts between language-model policies and environments."""
