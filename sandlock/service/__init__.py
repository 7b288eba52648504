"""The CLI service: a per-user process that keeps Sandlock imported and warm, so that
`sandlock run|net-run|pipe` from the C client (sandlock/_libexec/sandlock-client.c) starts
in milliseconds. server.py is the process; call.py serves one call in a child of it;
peer.py decides who may use it; prepared.py builds sandboxes ahead."""
