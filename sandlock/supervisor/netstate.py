"""What the network handlers know about one sandbox run: its endpoint policy, unix-socket
grants, DNS resolver and pins, and audit log."""

from __future__ import annotations

import threading
import weakref

from netpolicy.endpoint import canonical_address


def _holders(session, pid: int, sock: int):
    """A callable: the Identity (netpolicy.credentials.identify) of every process of the
    sandbox that holds the connecting socket when it is called — asked again at each
    request a program-bound credential could go on, so a socket handed on (SCM_RIGHTS,
    inherited, kept across an exec) is judged by whoever holds it then. Code the sandbox
    may write (its writable grants, workdir and layer storage, private TMPDIR) is not
    the program's own."""
    import os
    try:
        inode = os.fstat(sock).st_ino if sock >= 0 else None
    except OSError:
        inode = None
    policy = session.policy
    writable = list(policy.fs_writable)
    ws = policy.workspace
    if ws is not None:
        writable += [ws.workdir, ws.storage]

    def holders():
        from netpolicy.credentials import identify

        from ..process_tree import members
        if inode is None:
            return [identify(pid, writable)]
        link = f"socket:[{inode}]"
        found = []
        for m in members(session.root) if session.root else [pid]:
            try:
                fds = os.listdir(f"/proc/{m}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{m}/fd/{fd}") == link:
                        found.append(identify(m, writable))
                        break
                except OSError:
                    continue
        return found
    return holders


def _refresh(ref, stop: threading.Event, names, interval) -> None:
    """Re-resolve `names` as their TTLs run out, while the NetState lives."""
    while not stop.wait(max(1.0, interval * 0.8)):
        state = ref()
        if state is None:
            return
        ttls = []
        for n in names:
            try:
                ttls.append(state.pin(n))
            except Exception:  # keep the old pins until they expire
                ttls.append(interval)
        interval = min(ttls)
        del state


class NetState:
    def __init__(self, policy, audit=None):
        """`policy` is a sandlock Policy (its `endpoints`, `unix_allow`, `dns_servers`...)."""
        self._stop = threading.Event()  # first: __del__ needs it if the rest fails
        self.policy = policy.endpoints
        self.unix_allow = policy.unix_allow
        self.tcp_by_landlock = policy.tcp_by_landlock
        self.http = policy.http            # HttpPolicy or None
        self.http_ports = policy.http_ports
        self.http_raw = policy.http_raw     # endpoints relayed unfiltered, or None
        self.http_upgrades = policy.http_upgrades
        self.http_slots = None
        self.dns_slots = None  # the sandbox's share of the DNS responder (with DNS)
        if self.http is not None:
            from netpolicy.http_proxy import PER_SANDBOX
            self.http_slots = threading.BoundedSemaphore(PER_SANDBOX)
        self.interceptor = None            # netpolicy.tls_intercept.Interceptor
        self.ca_bundle = None              # (bundle, CA certificate) given to the sandbox
        spec = policy.intercept
        if spec is not None:
            from netpolicy.tls_intercept import interceptor
            self.interceptor = interceptor(spec.ca, spec.key, spec.upstream_ca, spec.certs_dir)
            if spec.ca_out:
                with open(spec.ca_out, "wb") as f:
                    f.write(self.interceptor.ca_pem)
            if spec.inject:
                self.ca_bundle = self.interceptor.publish(spec.public_dir)
            for bundle, spliced in spec.bundles:  # shown in place (confinement)
                self.interceptor.splice(bundle, spliced)
        self.secrets = None                # credential_policy.Secrets (read here, once)
        if policy.credentials is not None:
            from ..credential_policy import Secrets
            self.secrets = Secrets(policy.credentials)
        self.audit = audit
        self.report_only = policy.report_only  # refusals by rules: recorded, then allowed
        self.would_deny = 0                    # ... how many (the end-of-run line)
        self._local: frozenset = frozenset()
        self._local_until = 0.0
        # Report-only answers every name itself, so that names are recorded with what
        # the program then reaches.
        self.dns_enabled = bool(self.policy.hostnames) or self.report_only
        # Where names are resolved at all, the hosts HTTP rules name are resolved too (best
        # effort), so that a request reaching one of their addresses is judged under that
        # name as well (netpolicy.http_rules).
        self.http_names = self.http.named_hosts() if self.http is not None else ()
        if self.secrets is not None:
            self.http_names = tuple(dict.fromkeys(
                self.http_names + self.secrets.credentials.named_hosts()))
        self.resolver = self.pins = None
        self.dns_servers: set = set()
        if self.dns_enabled:
            from netpolicy.dns import Pins, Resolver
            from netpolicy.dns_proxy import PER_SANDBOX as DNS_PER_SANDBOX
            self.dns_slots = threading.BoundedSemaphore(DNS_PER_SANDBOX)
            self.resolver = Resolver(list(policy.dns_servers) or None)
            self.pins = Pins()
            from .fastpath import forget_all
            self.pins.on_change.append(forget_all)  # verdicts replayed in C rest on pins
            self.dns_servers = {(canonical_address(h), p) for h, p in self.resolver.servers}

    LOCAL_TTL = 5.0

    def local_addresses(self) -> frozenset:
        """This machine's interface addresses (special for host rules), re-read every
        LOCAL_TTL seconds; a change forgets the verdicts the C fast path replays."""
        import time
        now = time.monotonic()
        if now < self._local_until:
            return self._local
        from .._kernel.netlink import interface_addresses
        try:
            found = frozenset(canonical_address(a) for a in interface_addresses())
        except OSError:
            found = self._local  # keep the last answer; the special ranges still apply
        if found != self._local:
            from .fastpath import forget_all
            self._local = found
            forget_all()
        self._local_until = now + self.LOCAL_TTL
        return found

    def http_filtered(self, dest, names: tuple) -> bool:
        """Whether a TCP connection to `dest` goes through the HTTP filter: on an HTTP port,
        or to a host some HTTP rule names whatever the port (a dev server on :18080 gets
        the same rules as on :80), unless the policy marks that endpoint raw."""
        if self.http is None:
            return False
        if self.http_raw is not None and self.http_raw.decide(
                "tcp", dest.address, dest.port, names).allowed:
            return False
        names = (*names, str(dest.address))
        return dest.port in self.http_ports or self.http.names_host(names) or (
            self.secrets is not None and self.secrets.credentials.names_host(names))

    def is_dns(self, dest) -> bool:
        """Traffic to port 53 or to a configured resolver is DNS, and handled as such."""
        return self.dns_enabled and (dest.port == 53
                                     or (dest.address, dest.port) in self.dns_servers)

    def pin(self, name: str) -> int:
        """Resolve `name` ourselves and remember its addresses; returns the TTL."""
        addrs, ttl = self.resolver.resolve(name)
        self.pins.record(name, addrs, ttl)
        return ttl

    def start(self) -> None:
        """Resolve every exact host name now (a name that does not resolve is an error
        that names it), and the names HTTP rules use (best effort), then keep the answers
        fresh as their TTLs run out."""
        if self.resolver is None:
            return
        names = [r.host for r in self.policy.hostnames if r.wildcard is None]
        ttls = [self.pin(n) for n in names]
        for n in self.http_names:
            if n not in names:
                try:
                    ttls.append(self.pin(n))
                    names.append(n)
                except Exception:  # still judged by its spelling; it resolves to nothing now
                    pass
        if names:
            # The thread holds only a weak reference: it ends with this NetState (the
            # Sandbox dropped or changed), not with the process.
            threading.Thread(target=_refresh, args=(weakref.ref(self), self._stop, names,
                                                    min(ttls)),
                             daemon=True, name="sandlock-dns-refresh").start()

    def stop(self) -> None:
        self._stop.set()

    def __del__(self):
        self._stop.set()

    def dns_proxy(self):
        from netpolicy.dns_proxy import dns_proxy
        return dns_proxy()

    def http_context(self, req, session, dest, sock: int = -1):
        """What the HTTP filter needs to judge a connection redirected to it."""
        from netpolicy.http_proxy import HttpContext
        from .network import argv_of
        audit = self.audit
        record = None
        if audit is not None:
            def record(**fields):
                audit.record(syscall="connect", **fields)
        pins = self.pins
        credentials = holders = None
        if self.secrets is not None:
            credentials = self.secrets.credentials
            if credentials.bound:
                holders = _holders(session, req.pid, sock)
        return HttpContext(dest.address, dest.port, self.http,
                           pins.names_for if pins is not None else (lambda a: ()),
                           record, {"sandbox": session.name, "pid": req.pid,
                                    "argv": argv_of(req.pid)}, self.interceptor,
                           self.http_upgrades, self.http_slots,
                           pins.addresses_for if pins is not None else None,
                           credentials, holders, self._report if self.report_only else None)

    def _report(self) -> None:
        """The HTTP filter let through what its rules refused (report-only)."""
        self.would_deny += 1

    def dns_context(self, req):
        from netpolicy.dns_proxy import DnsContext
        pid = req.pid

        def on_decision(name, refusal):
            if self.audit is not None and (refusal or self.audit.log_allowed):
                from .network import argv_of
                self.audit.record(decision="deny" if refusal else "allow", pid=pid,
                                  argv=argv_of(pid), syscall="dns", protocol="dns", host=name,
                                  rule="default:dns" if refusal else "dns", reason=refusal)
        def allowed(name) -> bool:
            ok = self.policy.name_allowed(name) is not None
            if not ok and self.report_only:
                self.would_deny += 1
                if self.audit is not None:
                    from .network import argv_of
                    self.audit.record(decision="would-deny", pid=pid, argv=argv_of(pid),
                                      syscall="dns", protocol="dns", host=name,
                                      rule="default:dns",
                                      reason=f"no rule allows the name {name}")
                return True
            return ok
        return DnsContext(allowed, self.resolver, self.pins, on_decision, self.dns_slots)
