"""The CLI service: a per-user process that keeps Sandlock imported and warm, so that
`sandlock run|net-run|pipe` from the C client (sandlock/_libexec/sandlock-client.c) starts
in milliseconds. server.py is the process; peer.py decides who may use it."""
