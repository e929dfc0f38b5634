"""The math-verify worker process: ``python -m rollforge.envs.adapters._math_worker``.

Reads one JSON request per line on stdin, ``{"gold": str, "answer": str}``, and writes one JSON
line per request, ``{"correct": bool}`` or ``{"error": str}``. math-verify's own timeouts are off
(``parsing_timeout=None``, ``timeout_seconds=None``: they use ``signal.alarm``, which only works on
a main thread and would fire inside the host); the host bounds each request instead and kills this
process when one takes too long (``math_env.VerifyWorker``).
"""

from __future__ import annotations

import json
import logging
import sys


def main() -> int:
    logging.disable(logging.WARNING)  # math-verify warns on every call that its timeouts are off
    from math_verify import parse, verify

    for line in sys.stdin:
        try:
            request = json.loads(line)
            gold = parse(request["gold"], parsing_timeout=None)
            answer = parse(request["answer"], parsing_timeout=None)
            reply = {"correct": bool(verify(gold, answer, timeout_seconds=None))}
        except Exception as exc:  # a bad request or a parser bug answers this request only
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
