"""McpSandbox's worker, inside the tool's sandbox: import a tool module, call one
top-level function (stdlib only; the server passes this file's text to `python -I -c`).

stdin: {"module", "qualname", "syspath", "workspace", "args"} (JSON). The function's
return value is written to the original stdout as one JSON document {"result": ...}; what
the function itself prints goes to stderr, so it can never be taken for the result. A
parameter named `workspace` receives the sandbox's workspace (the caller cannot set it).
An exception: a traceback on stderr and exit status 1.
"""

import importlib
import inspect
import json
import os
import sys


def main() -> int:
    spec = json.loads(sys.stdin.buffer.read())
    out = os.dup(1)
    os.dup2(2, 1)  # the tool's own prints: stderr
    if spec.get("syspath"):
        sys.path.insert(0, spec["syspath"])
    func = getattr(importlib.import_module(spec["module"]), spec["qualname"])
    args = dict(spec.get("args") or {})
    try:
        param = inspect.signature(func).parameters.get("workspace")
    except (TypeError, ValueError):
        param = None
    if param is not None and param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
        args["workspace"] = spec["workspace"]
    result = func(**args)
    sys.stdout.flush()
    data = json.dumps({"result": result}, default=str).encode()
    while data:
        data = data[os.write(out, data):]
    return 0


if __name__ == "__main__":
    sys.exit(main())
