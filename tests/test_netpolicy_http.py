"""HTTP rules and path normalisation: pure code, table and property tests."""

import pytest
from hypothesis import given, settings, strategies as st

from netpolicy.http_path import PathError, normalize_path
from netpolicy.http_rules import HttpPolicy, HttpRuleError, parse_http_rule


@pytest.mark.parametrize("raw, expected", [
    ("/", "/"),
    ("/a/b", "/a/b"),
    ("/a/./b", "/a/b"),
    ("/a/../b", "/b"),
    ("/a/b/..", "/a/"),
    ("/../../etc", "/etc"),
    ("/%2e%2e/admin", "/admin"),
    ("/a/%2E%2E/admin", "/admin"),
    ("/%61dmin", "/admin"),             # unreserved escapes decoded
    ("/caf%c3%a9", "/caf%C3%A9"),       # others upper-cased, kept
    ("/a%20b", "/a%20b"),
])
def test_normalisation(raw, expected):
    assert normalize_path(raw) == expected


@pytest.mark.parametrize("raw", [
    "/a%2fb", "/a%2Fb", "/a%5cb", "/a\\b", "/a;jsessionid=1", "//admin", "/a//b",
    "/a%00b", "/a%0d%0aX", "/a\x00b", "/a b", "/%zz", "/%4", "/caf\u00e9", "/%c3%28",
    "relative", "/a\tb",
])
def test_refused_paths(raw):
    with pytest.raises(PathError):
        normalize_path(raw)


@pytest.mark.parametrize("rule, request_, allowed", [
    ("GET api.github.com/repos/*", ("GET", "api.github.com", "/repos/x/y"), True),
    ("GET api.github.com/repos/*", ("POST", "api.github.com", "/repos/x"), False),
    ("GET api.github.com/repos/*", ("get", "api.github.com", "/repos/x"), False),
    ("get api.github.com/repos/*", ("GET", "api.github.com", "/repos/x"), True),
    ("GET api.github.com/repos/*", ("GET", "api.github.com", "/user"), False),
    ("GET api.github.com/repos/*", ("GET", "evil.com", "/repos/x"), False),
    ("* api.github.com", ("DELETE", "api.github.com", "/anything"), True),
    ("GET */health", ("GET", "x.y", "/health"), True),
    ("GET */health", ("GET", "x.y", "/health/x"), False),
    ("GET *.example.com/*", ("GET", "a.example.com", "/"), True),
    ("GET *.example.com/*", ("GET", "example.com", "/"), False),
    ("GET **.example.com/*", ("GET", "example.com", "/"), True),
])
def test_rule_matching(rule, request_, allowed):
    policy = HttpPolicy.from_rules(allow=[rule])
    assert policy.decide(*request_).allowed is allowed


def test_deny_wins_and_structured_rules():
    policy = HttpPolicy.from_rules(
        allow=[{"methods": ["GET", "HEAD"], "host": "api.example.com", "path_prefix": "/v1/",
                "query": {"format": "json"}, "headers": {"Accept": "application/json"}}],
        deny=["* api.example.com/v1/admin*"])
    ok = policy.decide("GET", "api.example.com", "/v1/items", {"format": ["json"]},
                       {"accept": ["application/json"]})
    assert ok.allowed
    assert not policy.decide("GET", "api.example.com", "/v1/items", {"format": ["xml"]},
                             {"accept": ["application/json"]}).allowed
    denied = policy.decide("GET", "api.example.com", "/v1/admin/x", {"format": ["json"]},
                           {"accept": ["application/json"]})
    assert not denied.allowed and denied.rule == "* api.example.com/v1/admin*"
    no_rule = policy.decide("POST", "api.example.com", "/v1/x")
    assert no_rule.reason == "no rule allows POST api.example.com/v1/x"


@pytest.mark.parametrize("rule", [
    "GET", "GET api.github.com/repos/* extra", "G@T x.com/", "GET *.com/", "GET a*.x.com/",
    "GET x.com/a/*/b", "GET x.com/a/../b", {"host": "x.com", "paht": "/"},
    {"path": "/a", "path_exact": "/a"},
])
def test_bad_rules(rule):
    with pytest.raises(HttpRuleError):
        parse_http_rule(rule)


SEGMENTS = st.lists(st.sampled_from(["admin", "public", "..", ".", "%2e%2e", "%2E.", "a",
                                     "%61dmin", "ADMIN", "%2f", ";x", "", "%00", "b%20c"]),
                    min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(SEGMENTS)
def test_property_denied_after_normalisation_is_never_allowed(segments):
    """Whatever the encoding: either the path is refused, or its normalised form (the one
    string that would be forwarded) is what the policy decided on."""
    raw = "/" + "/".join(segments)
    policy = HttpPolicy.from_rules(allow=["GET x.test/*"], deny=["GET x.test/admin*"])
    try:
        path = normalize_path(raw)
    except PathError:
        return
    assert normalize_path(path) == path  # stable: forwarding re-normalises to itself
    assert "/../" not in path + "/" and "/./" not in path + "/" and "//" not in path
    verdict = policy.decide("GET", "x.test", path)
    assert verdict.allowed == (not path.startswith("/admin"))


# -- one destination, many names (review finding 4) --------------------------------------

ALIAS_POLICY = dict(allow=["GET *", "POST *"], deny=["* api.test/admin*", "POST api.test/*"])


@pytest.mark.parametrize("method, host, path, aliases, allowed", [
    ("GET", "api.test", "/admin/users", (), False),             # by name: denied
    ("GET", "127.0.0.1", "/admin/users", ("api.test",), False),  # IP literal, known as api.test
    ("POST", "127.0.0.1", "/x", ("api.test", "127.0.0.1"), False),
    ("GET", "other.test", "/admin", ("api.test",), False),      # another name, same address
    ("GET", "127.0.0.1", "/admin/users", (), True),             # nothing known: spelling only
    ("GET", "127.0.0.1", "/public", ("api.test",), True),        # control: not denied
    ("POST", "other.test", "/x", ("unrelated.test",), True),
])
def test_deny_rules_apply_under_every_name_of_the_destination(method, host, path, aliases,
                                                              allowed):
    from netpolicy.http_rules import HttpPolicy
    v = HttpPolicy.from_rules(**ALIAS_POLICY).decide(method, host, path, aliases=aliases)
    assert v.allowed is allowed, v
    if not allowed and aliases:
        assert "api.test" in v.reason


@pytest.mark.parametrize("sni, aliases, allowed, fragment", [
    ("api.test", (), False, "denied by"),
    ("127.0.0.1", ("api.test",), False, "denied by"),
    ("127.0.0.1", ("admin.test",), False, "interception is required"),
    ("127.0.0.1", ("other.test",), True, "allowed"),
])
def test_tls_deny_rules_apply_under_every_name(sni, aliases, allowed, fragment):
    from netpolicy.http_rules import HttpPolicy, decide_tls_host
    policy = HttpPolicy.from_rules(["* *"], ["* api.test", "GET admin.test/x"])
    v = decide_tls_host(policy, sni, aliases)
    assert v.allowed is allowed and fragment in v.reason, v


def test_named_hosts_are_the_concrete_names_only():
    from netpolicy.http_rules import HttpPolicy
    p = HttpPolicy.from_rules(["GET api.test/x", "* *.wild.test", "GET 127.0.0.1/"],
                              ["* admin.test", "* *"])
    assert p.named_hosts() == ("api.test", "admin.test")


@pytest.mark.parametrize("target", [b"secret.test:443", b"10.9.9.9:443",
                                    b"[::ffff:10.9.9.9]:443", b"other.test:443"])
def test_connect_tunnels_meet_deny_rules_under_every_name(target):
    """Second review: a CONNECT target was judged under its spelling only: the address a
    denied name resolved to (or another name of it) tunnelled past `* secret.test`."""
    import ipaddress
    import h11
    from netpolicy.http_proxy import HttpContext, Refusal, decide_request
    from netpolicy.http_rules import HttpPolicy
    policy = HttpPolicy.from_rules(allow=(), deny=["* secret.test"])
    secret = ipaddress.ip_address("10.9.9.9")
    names = {secret: ("secret.test", "other.test")}
    ctx = HttpContext("127.0.0.1", 3128, policy, lambda a: names.get(a, ()),
                      upgrades={"connect"},
                      addresses_for=lambda n: (secret,) if n in ("secret.test", "other.test")
                      else ())
    req = h11.Request(method=b"CONNECT", target=target, headers=[(b"host", target)])
    with pytest.raises(Refusal, match="secret.test"):
        decide_request(ctx, req)
    control = h11.Request(method=b"CONNECT", target=b"10.1.1.1:443",
                          headers=[(b"host", b"10.1.1.1:443")])
    assert decide_request(ctx, control).method == b"CONNECT"
