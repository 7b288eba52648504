"""web_fetch, run inside the tool's sandbox (stdlib only; the server passes this file's
text to `python -I -S -c`).

    _fetch URL METHOD MAX_BYTES TIMEOUT HEADERS_JSON    (a request body, if any, on stdin)

Every request, redirects included, leaves through the sandbox's network policy and HTTP
rules (the supervisor and its HTTP filter; credentials are added there, never here). No
proxy from the environment is used. Prints one JSON object: the response (any status), or
{"ok": false, "errno": NAME, "error": text} when no response came (exit status 1).
"""

import base64
import errno
import json
import sys
import urllib.error
import urllib.request


def main(argv) -> None:
    url, method, limit, timeout = argv[0], argv[1], int(argv[2]), float(argv[3])
    headers = json.loads(argv[4])
    body = sys.stdin.buffer.read() if method not in ("GET", "HEAD") else None
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=body or None, method=method, headers=headers)
    try:
        resp = opener.open(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        resp = e
    except urllib.error.URLError as e:
        reason = e.reason
        code = getattr(reason, "errno", None)
        print(json.dumps({"ok": False, "errno": errno.errorcode.get(code or 0, code),
                          "error": str(reason)}))
        sys.exit(1)
    except OSError as e:
        print(json.dumps({"ok": False, "errno": errno.errorcode.get(e.errno or 0, e.errno),
                          "error": str(e)}))
        sys.exit(1)
    try:
        data = resp.read(limit + 1)
    except OSError as e:
        data = b""
        print(json.dumps({"ok": False, "errno": errno.errorcode.get(e.errno or 0, e.errno),
                          "error": f"reading the response: {e}"}))
        sys.exit(1)
    out = {"ok": True, "status": resp.status, "reason": resp.reason, "url": resp.geturl(),
           "headers": [[k, v] for k, v in resp.headers.items()][:100],
           "truncated": len(data) > limit}
    data = data[:limit]
    try:
        out["text"] = data.decode(resp.headers.get_content_charset() or "utf-8")
    except (UnicodeDecodeError, LookupError):
        out["base64"] = base64.b64encode(data).decode()
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
