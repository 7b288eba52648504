"""HTTPS interception: a local CA mints a certificate per server name (SNI), so the HTTP
filter can read and judge each request inside TLS; upstream connections are TLS again,
verified against the system roots or a configured bundle, never downgraded.

The CA lives in a certificate store built on mitmproxy's `CertStore` (imported only
here, when interception is first used: it costs about 0.1 s). Default store:
$SANDLOCK_CERTS_DIR, else $XDG_DATA_HOME/sandlock/certs, else ~/.local/share/sandlock/certs;
files `sandlock-ca.pem` (key and certificate, mode 0600) and `sandlock-ca-cert.pem` (the
public certificate). The CA's private key must never be readable inside a sandbox: the
caller denies `secret_paths()` to it.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
from pathlib import Path

BASENAME = "sandlock"


def default_certs_dir() -> Path:
    if os.environ.get("SANDLOCK_CERTS_DIR"):
        return Path(os.environ["SANDLOCK_CERTS_DIR"])
    data = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(data) / "sandlock" / "certs"


def open_store(directory: Path):
    """The CertStore in `directory`, creating the directory (0700) and the CA if needed."""
    from mitmproxy.certs import CertStore
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(directory, 0o700)
    return CertStore.from_store(directory, BASENAME, 2048)


class Interceptor:
    """One CA and the TLS contexts built from it."""

    def __init__(self, ca: str | None = None, key: str | None = None,
                 upstream_ca: str | None = None, certs_dir: str | None = None):
        from mitmproxy.certs import CertStore
        directory = Path(certs_dir) if certs_dir else default_certs_dir()
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Leaf keys (and a combined copy of an external CA) live inside the store
        # directory, which sandboxes are denied; removed when this process exits.
        self._private = Path(tempfile.mkdtemp(prefix="run-", dir=directory))  # 0700
        import atexit
        import shutil
        atexit.register(shutil.rmtree, self._private, True)
        if ca is not None:
            combined = self._private / "ca.pem"
            pem = Path(ca).read_bytes()
            if key is not None:
                pem = Path(key).read_bytes() + b"\n" + pem
            fd = os.open(combined, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
            try:
                self.store = CertStore.from_files(combined, self._private / "dhparam.pem")
            finally:
                os.unlink(combined)  # the key now lives in memory only
            self.secrets = [str(Path(p).resolve()) for p in (ca, key) if p is not None]
        else:
            self.store = open_store(directory)
            self.secrets = [str(directory.resolve())]
        self.ca_pem = self.store.default_ca.to_pem()
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self.upstream = ssl.create_default_context(cafile=upstream_ca)
        self.upstream.check_hostname = True
        self.upstream.verify_mode = ssl.CERT_REQUIRED

    def secret_paths(self) -> list[str]:
        """Paths holding the CA's private key (to deny to every sandbox)."""
        return self.secrets + [str(self._private)]

    MAX_CONTEXTS = 1024

    def server_context(self, name: str) -> ssl.SSLContext:
        """A server context presenting a leaf for `name`, signed by our CA (cached, at most
        MAX_CONTEXTS names). mitmproxy's leaves reuse the CA's key pair, so the file
        load_cert_chain needs exists only for the moment it is read."""
        with self._lock:
            ctx = self._contexts.get(name)
            if ctx is not None:
                return ctx
            if len(self._contexts) >= self.MAX_CONTEXTS:
                self._contexts.pop(next(iter(self._contexts)))
            from cryptography import x509
            from cryptography.hazmat.primitives import serialization
            entry = self.store.get_cert(name, [x509.DNSName(name)])
            path = self._private / "leaf.pem"
            key = entry.privatekey.private_bytes(serialization.Encoding.PEM,
                                                 serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption())
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key + entry.cert.to_pem())
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                ctx.load_cert_chain(path)
            finally:
                os.unlink(path)
            ctx.set_alpn_protocols(["http/1.1"])
            self._contexts[name] = ctx
            return ctx

    def publish(self, directory: str) -> tuple[str, str]:
        """Write our CA certificate and the system bundle plus it into `directory`
        (public files, named by the CA's fingerprint); returns (bundle, certificate)."""
        import hashlib
        tag = hashlib.sha256(self.ca_pem).hexdigest()[:16]
        cert_path = os.path.join(directory, f"sandlock-ca-{tag}.pem")
        bundle_path = os.path.join(directory, f"bundle-{tag}.pem")
        for path, data in ((cert_path, self.ca_pem), (bundle_path, self.bundle())):
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        return bundle_path, cert_path

    def splice(self, bundle: str, out: str) -> None:
        """Write `bundle` plus our CA certificate to `out`, in place (its inode is what a
        sandbox is allowed to read), and only when it differs (another sandbox may be
        reading it)."""
        data = self.bundle(bundle)
        fd = os.open(out, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "r+b") as f:
            if f.read() != data:
                f.seek(0)
                f.truncate()
                f.write(data)

    def bundle(self, system_bundle: str | None = None) -> bytes:
        """The system's CA bundle plus our CA certificate."""
        path = system_bundle or ssl.get_default_verify_paths().cafile or \
            "/etc/ssl/certs/ca-certificates.crt"
        try:
            system = Path(path).read_bytes()
        except OSError:
            system = b""
        return system.rstrip(b"\n") + b"\n" + self.ca_pem


_interceptors: dict[tuple, Interceptor] = {}
_lock = threading.Lock()


def interceptor(ca=None, key=None, upstream_ca=None, certs_dir=None) -> Interceptor:
    """The Interceptor for this configuration (built once per process)."""
    k = (ca, key, upstream_ca, certs_dir if ca is None else None)
    with _lock:
        if k not in _interceptors:
            _interceptors[k] = Interceptor(ca, key, upstream_ca, certs_dir)
        return _interceptors[k]
