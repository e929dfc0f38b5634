"""Scale-out on Ray (``executor: ray``): environments in pools of actors, generation replicas
behind a router. Nothing here is imported unless a run asks for Ray; ``ray`` is the optional
extra ``rollforge[ray]``."""
