"""The tools of `sandlock mcp`: their schemas, their arguments checked, and each call run
in a fresh sandbox under the tool's policy (toolpolicy.py), with its denials returned.

Every call returns a Reply: text for the model, structured content (JSON) for the client,
and is_error. Nothing a call does raises out of `call`: a bad argument, a policy that
does not start, a timeout or a denial is a tool error (is_error), never a server crash.

The file tools refuse, before anything runs, absolute paths, `..` and paths that resolve
(through symbolic links) outside the workspace; inside their sandbox every component is
opened again without following links (_fileops.py), and Landlock grants only the
workspace, so neither check depends on the other.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

from ..fs_rules import is_beneath
from . import denials as _denials
from . import runner
from .toolpolicy import ToolPolicy

MAX_COMMAND = 100_000          # characters of a shell command (it is one argv entry)
MAX_CODE = 1 << 20             # bytes of Python code (sent on stdin)
MAX_FILE = 10 << 20            # bytes read_file returns / write_file writes
MAX_FETCH = 10 << 20           # bytes of a fetched body
MAX_ENTRIES = 5000             # list_files
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

_S, _I, _O = {"type": "string"}, {"type": "integer", "minimum": 1}, {"type": "object"}
SCHEMAS = {
    "shell": ("Run a shell command (sh -c) in the workspace, in a fresh sandbox under the "
              "shell tool's policy. Returns stdout, stderr, the exit code and any denials.",
              {"command": {**_S, "description": "the command line"},
               "timeout": {**_I, "description": "seconds (at most the policy's)"}},
              ["command"]),
    "python": ("Run Python code (python3, the code on stdin) in the workspace, in a fresh "
               "sandbox under the python tool's policy.",
               {"code": {**_S, "description": "the program"},
                "timeout": {**_I, "description": "seconds (at most the policy's)"}},
               ["code"]),
    "read_file": ("Read a file of the workspace (a path relative to it; no '..', no links "
                  "leading out).",
                  {"path": _S, "max_bytes": {**_I, "description": "default 1 MiB"}},
                  ["path"]),
    "write_file": ("Write a file of the workspace (created with its parent directories, or "
                   "replaced).",
                   {"path": _S, "content": _S,
                    "encoding": {"type": "string", "enum": ["utf-8", "base64"]}},
                   ["path", "content"]),
    "list_files": ("List a directory of the workspace (default: its top).",
                   {"path": {**_S, "description": "relative to the workspace; default '.'"}},
                   []),
    "web_fetch": ("Fetch a URL from inside a sandbox, through the web_fetch tool's network "
                  "policy and HTTP rules. Returns the status, headers and body; a request "
                  "the policy refuses is returned as a denial.",
                  {"url": _S, "method": {"type": "string", "enum": list(METHODS)},
                   "headers": {**_O, "additionalProperties": _S}, "body": _S,
                   "max_bytes": {**_I, "description": "default 1 MiB"}},
                  ["url"]),
    "changes": ("List what the tool calls changed in the workspace so far (copy-on-write: "
                "nothing is applied until commit).", {}, []),
    "commit": ("Apply every pending change to the workspace.", {}, []),
    "discard": ("Discard every pending change.", {}, []),
}


@dataclass
class Reply:
    text: str
    data: dict
    is_error: bool = False


class ToolInputError(ValueError):
    """A call's arguments are not what the tool's schema says."""


def _source(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), name)) as f:
        return f.read()


def interpreter() -> tuple[str, list[str]]:
    """The Python that runs the built-in helpers (this process's own, by its real path, with
    -I -S: only its standard library), and what must be readable for it beyond /usr."""
    from ..policy import system_readable
    exe = os.path.realpath(sys.executable)
    grants = []
    for p in (os.path.dirname(exe), os.path.realpath(sys.base_prefix)):
        if not any(is_beneath(p, s) for s in system_readable()) and p not in grants:
            grants.append(p)
    return exe, grants


class ToolBox:
    def __init__(self, workspace: str, policies: dict[str, ToolPolicy],
                 auditor: runner.Auditor, staging=None):
        self.workspace = os.path.realpath(workspace)
        self.policies = policies
        self.auditor = auditor
        self.staging = staging
        self.python, self.python_grants = interpreter()

    @property
    def root(self) -> str:
        """Where tools work: the workspace, or with --cow the staging tree."""
        return self.staging.tree if self.staging is not None else self.workspace

    def names(self) -> list[str]:
        extra = ["changes", "commit", "discard"] if self.staging is not None else []
        return list(self.policies) + extra

    def definitions(self) -> list[tuple[str, str, dict]]:
        out = []
        for name in self.names():
            text, props, required = SCHEMAS[name]
            out.append((name, text, {"type": "object", "properties": props,
                                     "required": required, "additionalProperties": False}))
        return out

    def call(self, name: str, args: dict | None) -> Reply:
        """Run one call (blocking); every failure is a Reply with is_error."""
        args = dict(args or {})
        if name not in self.names():
            return _error(f"unknown tool {name!r} (this server has {', '.join(self.names())})")
        try:
            _check_args(name, args)
            if name in ("changes", "commit", "discard"):
                return self._workspace_call(name)
            if self.staging is not None:
                with self.staging.lock:
                    return getattr(self, "_" + name)(args)
            return getattr(self, "_" + name)(args)
        except ToolInputError as e:
            return _error(f"{name}: {e}")
        except runner.CallError as e:
            return _error(str(e))
        except Exception as e:  # a bug here must not end the server: say what it was
            return _error(f"{name}: internal error: {e!r}")

    # -- running ------------------------------------------------------------------------

    def _run(self, tool: str, argv: list[str], *, input: bytes | None = None,
             timeout: float | None = None, max_output: int = runner.MAX_OUTPUT,
             helper: bool = False) -> runner.CallOutcome:
        policy = self.policies[tool]
        fields = policy.sandbox_fields(self.root)
        extra = self.python_grants if helper else self._toolchain(argv[0], fields)
        if extra:
            from ..policy_file import merge_fields
            fields = merge_fields(fields, {"fs_readable": extra})
        limit = policy.timeout if timeout is None else min(timeout, policy.timeout)
        return runner.run(fields, argv, tool=tool, source=policy.source,
                          auditor=self.auditor, timeout=limit, input=input,
                          max_output=max_output)

    def _toolchain(self, argv0: str, fields: dict) -> list[str]:
        """What `sandlock run` grants for the command's own toolchain (a pyenv or venv
        python3 on PATH ...): read and execute only."""
        if not fields.get("fs_readable"):
            return []
        from ..sandbox import _CLEAN_ENV_KEEP
        from ..toolchain import toolchain_grants
        env = {k.decode(): os.environ[k.decode()] for k in _CLEAN_ENV_KEEP
               if k.decode() in os.environ}
        env.update(fields.get("env") or {})
        return [g.path for g in toolchain_grants(argv0, env, fields.get("cwd"))]

    def _helper(self, tool: str, script: str, args: list[str], **kw) -> runner.CallOutcome:
        return self._run(tool, [self.python, "-I", "-S", "-c", _source(script), *args],
                         helper=True, **kw)

    # -- the tools ----------------------------------------------------------------------

    def _shell(self, args: dict) -> Reply:
        command = args["command"]
        if len(command) > MAX_COMMAND or "\0" in command:
            raise ToolInputError(f"command: at most {MAX_COMMAND} characters, no NUL")
        return self._process_reply("shell", self._run("shell", ["sh", "-c", command],
                                                      timeout=args.get("timeout")))

    def _python(self, args: dict) -> Reply:
        code = args["code"].encode()
        if len(code) > MAX_CODE:
            raise ToolInputError(f"code: at most {MAX_CODE} bytes")
        return self._process_reply("python", self._run("python", ["python3", "-"],
                                                       input=code or b"\n",
                                                       timeout=args.get("timeout")))

    def _process_reply(self, tool: str, out: runner.CallOutcome) -> Reply:
        stdout = out.stdout.decode(errors="replace")
        stderr = out.stderr.decode(errors="replace")
        data = {"tool": tool, "exit_code": out.exit_code, "stdout": stdout,
                "stderr": stderr, "truncated": out.truncated, "timed_out": out.timed_out,
                "denials": out.denials, "error": out.error}
        parts = [stdout] if stdout else []
        if stderr:
            parts.append(f"[stderr]\n{stderr}")
        status = "timed out" if out.timed_out else f"exit code {out.exit_code}"
        parts.append(f"[{status}{'; output truncated' if out.truncated else ''}]")
        if out.error and not out.timed_out:
            parts.append(f"[{out.error}]")
        if out.denials:
            parts.append(_denials.summary(out.denials))
        return Reply("\n".join(parts), data, is_error=not out.success)

    def _path(self, tool: str, rel: str, action: str) -> tuple[str | None, dict | None]:
        """(the path relative to the tool root, resolved) or (None, a denial)."""
        policy = self.policies[tool]
        if "\0" in rel or len(rel) > 4096:
            raise ToolInputError("path: at most 4096 characters, no NUL")
        why = None
        if rel.startswith("/"):
            why = "an absolute path: the file tools take paths relative to the workspace"
        elif ".." in rel.split("/"):
            why = "'..' would leave the workspace: the file tools stay inside it"
        if why is None:
            root = self.root
            real = os.path.realpath(os.path.join(root, rel))
            if is_beneath(real, root):
                return os.path.relpath(real, root) if real != root else "", None
            why = f"it resolves outside the workspace (through a symbolic link, to {real})"
        return None, self._logged(tool, _denials.file_denial(
            action, rel, why, tool, policy.source, None, "workspace", self._name(tool)))

    def _name(self, tool: str) -> str:
        return self.policies[tool].sandbox_fields(None)["name"]

    def _logged(self, tool: str, denial: dict) -> dict:
        """A denial decided here (not by the supervisor) goes to the policy's audit log
        too."""
        fields = self.policies[tool].fields
        if fields.get("audit_log"):
            self.auditor.forward(fields["audit_log"], bool(fields.get("audit_allowed")),
                                 [denial["record"]])
        return denial

    def _file_failure(self, tool: str, action: str, rel: str, out) -> Reply:
        """A file helper that failed: its JSON error, a Landlock denial when EACCES."""
        try:
            said = json.loads(out.stdout or b"{}")
        except ValueError:
            said = {}
        code = said.get("errno")
        found = list(out.denials)
        full = os.path.join(self.root, said.get("at") or rel)
        if code in ("EACCES", "EPERM"):
            policy = self.policies[tool]
            need = "write" if action == "write" else "read"
            fix = None
            if ACCESS_ORDER[policy.access] < ACCESS_ORDER[need]:
                fix = "workspace_access"
            found.append(self._logged(tool, _denials.file_denial(
                action, full, f"refused by the {tool} tool's sandbox (Landlock: its grants, "
                f"filesystem.deny or the user-file protection)", tool, policy.source, fix,
                "landlock", self._name(tool))))
            if fix:
                found[-1]["allow_with"]["add"] = need
        elif code == "ELOOP":
            found.append(self._logged(tool, _denials.file_denial(
                action, rel, "a symbolic link on the way (the file tools never follow one "
                "inside their sandbox)", tool, self.policies[tool].source, None, "workspace",
                self._name(tool))))
        text = said.get("error") or out.error or out.stderr.decode(errors="replace")[-500:] \
            or f"exit status {out.exit_code}"
        data = {"tool": tool, "path": rel, "errno": code, "error": text, "denials": found}
        lines = [f"{tool} {rel}: {text}"] + ([_denials.summary(found)] if found else [])
        return Reply("\n".join(lines), data, is_error=True)

    def _read_file(self, args: dict) -> Reply:
        rel, denial = self._path("read_file", args["path"], "read")
        if denial is not None:
            return _denied("read_file", args["path"], denial)
        limit = min(args.get("max_bytes") or (1 << 20), MAX_FILE)
        out = self._helper("read_file", "_fileops.py", ["read", rel, str(limit)],
                           max_output=_json_room(limit))
        if not out.success:
            return self._file_failure("read_file", "read", rel, out)
        said = _said("read_file", out)
        data = {"tool": "read_file", "path": args["path"], "size": said["size"],
                "truncated": said["truncated"], "denials": out.denials}
        if "text" in said:
            data["text"] = said["text"]
            text = said["text"]
        else:
            data["base64"] = said["base64"]
            text = f"(binary, {said['size']} bytes: in structured content as base64)"
        if said["truncated"]:
            text += f"\n[truncated at {limit} bytes of {said['size']}]"
        return Reply(text, data)

    def _write_file(self, args: dict) -> Reply:
        rel, denial = self._path("write_file", args["path"], "write")
        if denial is not None:
            return _denied("write_file", args["path"], denial)
        if not rel:
            raise ToolInputError("path: names the workspace itself")
        if args.get("encoding") == "base64":
            import base64
            import binascii
            try:
                content = base64.b64decode(args["content"], validate=True)
            except (binascii.Error, ValueError):
                raise ToolInputError("content: not valid base64") from None
        else:
            content = args["content"].encode()
        if len(content) > MAX_FILE:
            raise ToolInputError(f"content: at most {MAX_FILE} bytes")
        out = self._helper("write_file", "_fileops.py", ["write", rel, str(MAX_FILE)],
                           input=content or None)
        if not out.success:
            return self._file_failure("write_file", "write", rel, out)
        return Reply(f"wrote {len(content)} bytes to {args['path']}",
                     {"tool": "write_file", "path": args["path"], "size": len(content),
                      "denials": out.denials})

    def _list_files(self, args: dict) -> Reply:
        rel, denial = self._path("list_files", args.get("path") or ".", "list")
        if denial is not None:
            return _denied("list_files", args.get("path") or ".", denial)
        out = self._helper("list_files", "_fileops.py", ["list", rel, str(MAX_ENTRIES)],
                           max_output=_json_room(MAX_ENTRIES * 512))
        if not out.success:
            return self._file_failure("list_files", "list", rel or ".", out)
        said = _said("list_files", out)
        lines = [f"{e['kind']:<7} {e['size']:>10}  {e['name']}" for e in said["entries"]]
        if said["truncated"]:
            lines.append(f"[only the first {MAX_ENTRIES} entries]")
        return Reply("\n".join(lines) or "(empty)",
                     {"tool": "list_files", "path": args.get("path") or ".",
                      "entries": said["entries"], "truncated": said["truncated"],
                      "denials": out.denials})

    def _web_fetch(self, args: dict) -> Reply:
        from urllib.parse import urlsplit
        url = args["url"]
        method = args.get("method") or "GET"
        parts = urlsplit(url) if len(url) <= 8192 else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ToolInputError("url: an http:// or https:// URL (at most 8192 characters)")
        headers = args.get("headers") or {}
        if len(headers) > 50 or any(not isinstance(v, str) or any(c in k + v for c in "\r\n\0")
                                    for k, v in headers.items()):
            raise ToolInputError("headers: at most 50, strings without line breaks")
        body = (args.get("body") or "").encode()
        if body and method in ("GET", "HEAD"):
            raise ToolInputError(f"body: not with {method}")
        limit = min(args.get("max_bytes") or (1 << 20), MAX_FETCH)
        policy = self.policies["web_fetch"]
        out = self._helper("web_fetch", "_fetch.py",
                           [url, method, str(limit), str(max(1.0, policy.timeout - 1)),
                            json.dumps(headers)],
                           input=body or None, max_output=_json_room(limit))
        try:
            said = json.loads(out.stdout or b"{}")
        except ValueError:
            said = {}
        refused = [d for d in out.denials if d["kind"] in ("http", "https", "tls")]
        if not said.get("ok"):
            reason = said.get("error") or out.error or \
                out.stderr.decode(errors="replace")[-500:] or f"exit status {out.exit_code}"
            data = {"tool": "web_fetch", "url": url, "error": reason,
                    "timed_out": out.timed_out, "denials": out.denials}
            text = f"web_fetch {url}: no response ({reason})"
            if out.denials:
                text += "\n" + _denials.summary(out.denials)
            return Reply(text, data, is_error=True)
        data = {"tool": "web_fetch", "url": url, "final_url": said["url"],
                "status": said["status"], "reason": said["reason"],
                "headers": said["headers"], "truncated": said["truncated"],
                "denials": out.denials}
        data.update({k: said[k] for k in ("text", "base64") if k in said})
        denied = bool(refused) and said["status"] == 403
        text = f"HTTP {said['status']} {said['reason']}\n"
        text += said.get("text", "(binary body: in structured content as base64)")
        if out.denials:
            text += "\n" + _denials.summary(out.denials)
        return Reply(text, data, is_error=denied)

    # -- the copy-on-write workspace ----------------------------------------------------

    def _workspace_call(self, name: str) -> Reply:
        with self.staging.lock:
            report = getattr(self.staging, name)()
        report["tool"] = name
        if name == "discard":
            return Reply(f"every pending change discarded; {self.workspace} untouched", report)
        lines = [c["line"] for c in report["changes"]]
        head = {"changes": f"{len(lines)} pending change(s) to {self.workspace}",
                "commit": f"{len(lines)} change(s) applied to {self.workspace}"
                if report["applied"] else f"nothing applied to {self.workspace}"}[name]
        lines.insert(0, head)
        for c in report["conflicts"]:
            lines.append(f"conflict: {c['path']}: {c['reason']}")
        for c in report["refused"]:
            lines.append(f"refused: {c['path']}: {c['reason']}")
        if report.get("error"):
            lines.append(f"error: {report['error']}")
        return Reply("\n".join(lines), report, is_error=not report["ok"])


ACCESS_ORDER = {"none": 0, "read": 1, "write": 2}


def _json_room(limit: int) -> int:
    """Room for a helper's JSON answer carrying `limit` bytes (escapes take up to 6)."""
    return 6 * limit + (1 << 20)


def _said(tool: str, out) -> dict:
    """A helper's JSON answer; CallError when there is none (never a bare ValueError)."""
    try:
        said = json.loads(out.stdout)
    except ValueError:
        said = None
    if not isinstance(said, dict):
        raise runner.CallError(f"{tool}: its helper gave no answer"
                               + (" (output over the limit)" if out.truncated else ""))
    return said


def _error(text: str) -> Reply:
    return Reply(text, {"error": text, "denials": []}, is_error=True)


def _denied(tool: str, path: str, denial: dict) -> Reply:
    text = _denials.summary([denial])
    return Reply(text, {"tool": tool, "path": path, "error": denial["reason"],
                        "denials": [denial]}, is_error=True)


def _check_args(name: str, args: dict) -> None:
    """The schema's rules, checked here (a client may send anything)."""
    _, props, required = SCHEMAS[name]
    for key in args:
        if key not in props:
            raise ToolInputError(f"unknown argument {key!r} (expected "
                                 f"{', '.join(props) or 'none'})")
    for key in required:
        if key not in args:
            raise ToolInputError(f"missing argument {key!r}")
    for key, value in args.items():
        kind = props[key]["type"]
        ok = {"string": isinstance(value, str),
              "integer": isinstance(value, int) and not isinstance(value, bool) and value >= 1,
              "object": isinstance(value, dict)}[kind]
        if not ok:
            expected = "a positive integer" if kind == "integer" else f"a {kind}"
            raise ToolInputError(f"{key}: expected {expected}")
        if "enum" in props[key] and value not in props[key]["enum"]:
            raise ToolInputError(f"{key}: expected one of {', '.join(props[key]['enum'])}")
