"""Common five-letter English words: the answers and the allowed guesses of ``wordle``.

Embedded so that the environment needs no download. Lower case, no duplicates, sorted; a test
checks all three.
"""

from __future__ import annotations

WORDS: tuple[str, ...] = (
    "about", "above", "actor", "adult", "after", "again", "agree", "ahead", "alarm", "album",
    "alive", "allow", "alone", "along", "among", "angle", "angry", "apple", "apply", "arena",
    "argue", "arise", "armor", "aside", "audio", "avoid", "award", "aware", "bacon", "badge",
    "basic", "beach", "beard", "begin", "below", "bench", "berry", "birth", "black", "blade",
    "blame", "blank", "blind", "block", "blood", "board", "boost", "brain", "brand", "brave",
    "bread", "break", "brick", "bride", "brief", "bring", "broad", "brown", "brush", "build",
    "buyer", "cabin", "cable", "camel", "candy", "canoe", "carry", "catch", "cause", "chain",
    "chair", "chalk", "charm", "chart", "cheap", "check", "cheek", "chess", "chest", "chief",
    "child", "civil", "claim", "class", "clean", "clear", "climb", "clock", "close", "cloud",
    "coach", "coast", "color", "coral", "count", "court", "cover", "crane", "crash", "crate",
    "cream", "crime", "cross", "crowd", "crown", "curve", "cycle", "daily", "dance", "delay",
    "depth", "dirty", "doubt", "dozen", "draft", "drama", "dream", "dress", "drink", "drive",
    "eager", "early", "earth", "eight", "elbow", "empty", "enemy", "enjoy", "enter", "entry",
    "equal", "error", "event", "every", "exact", "exist", "extra", "faith", "false", "fancy",
    "fault", "feast", "fence", "fever", "field", "fight", "final", "first", "fjord", "flame",
    "flash", "fleet", "floor", "flour", "fluid", "focus", "force", "forty", "frame", "fresh",
    "front", "frost", "fruit", "funny", "ghost", "giant", "given", "glass", "globe", "glove",
    "grace", "grade", "grain", "grand", "grape", "grass", "great", "green", "group", "guard",
    "guess", "guest", "guide", "habit", "happy", "heard", "heart", "heavy", "hello", "honey",
    "horse", "hotel", "house", "human", "humor", "ideal", "image", "index", "inner", "input",
    "issue", "jelly", "joint", "judge", "juice", "jumbo", "kayak", "knife", "label", "large",
    "laser", "later", "laugh", "layer", "learn", "lemon", "level", "light", "limit", "local",
    "logic", "loose", "lucky", "lunch", "magic", "major", "maker", "march", "match", "maybe",
    "mayor", "medal", "metal", "minor", "model", "money", "month", "moral", "motor", "mount",
    "mouse", "mouth", "movie", "music", "nerve", "never", "night", "noble", "noise", "north",
    "novel", "nurse", "ocean", "offer", "often", "olive", "onion", "order", "other", "owner",
    "paint", "panel", "paper", "party", "peace", "pearl", "phase", "phone", "photo", "piano",
    "piece", "pilot", "pitch", "pizza", "place", "plain", "plane", "plant", "plate", "plaza",
    "point", "pound", "power", "press", "price", "pride", "prime", "print", "prize", "proof",
    "proud", "queen", "quick", "quiet", "quilt", "radio", "raise", "range", "rapid", "ratio",
    "reach", "ready", "river", "robot", "rough", "round", "route", "royal", "salad", "scale",
    "scene", "scope", "score", "sense", "serve", "seven", "shade", "shape", "share", "sharp",
    "sheep", "shelf", "shell", "shift", "shirt", "shock", "shore", "short", "sight", "skill",
    "slate", "sleep", "slice", "small", "smart", "smile", "smoke", "snake", "solid", "solve",
    "sound", "south", "space", "spare", "speak", "speed", "spend", "spice", "spoon", "sport",
    "staff", "stage", "stair", "stand", "stare", "start", "steam", "steel", "stick", "still",
    "stone", "store", "storm", "story", "sugar", "sunny", "super", "sweet", "table", "taste",
    "teach", "thank", "theme", "thick", "thing", "think", "three", "throw", "tiger", "tight",
    "title", "toast", "today", "tooth", "topic", "total", "touch", "tower", "trace", "track",
    "trade", "train", "treat", "trend", "trial", "truck", "trust", "truth", "twice", "uncle",
    "under", "union", "unity", "until", "upper", "urban", "usual", "valid", "value", "video",
    "visit", "vital", "vivid", "voice", "waltz", "waste", "watch", "water", "wheel", "where",
    "which", "while", "white", "whole", "woman", "world", "worry", "worth", "write", "wrong",
    "yield", "young", "youth", "zebra",
)

WORD_SET: frozenset[str] = frozenset(WORDS)
