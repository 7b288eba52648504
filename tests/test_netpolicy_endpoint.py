"""The endpoint grammar, as a table (pure code: no sockets, no DNS)."""

import ipaddress

import pytest

from netpolicy.endpoint import EndpointError, canonical_address, parse_endpoint

A = ipaddress.ip_address


@pytest.mark.parametrize("spec, proto, addr, port, names, expected", [
    (":443", "tcp", "1.2.3.4", 443, (), True),
    (":443", "udp", "1.2.3.4", 443, (), True),           # no scheme = TCP and UDP
    (":443", "tcp", "1.2.3.4", 80, (), False),
    ("tcp://:443", "udp", "1.2.3.4", 443, (), False),
    ("*:80,443", "tcp", "::1", 80, (), True),
    ("*", "tcp", "9.9.9.9", 1, (), True),
    ("127.0.0.1:8080", "tcp", "127.0.0.1", 8080, (), True),
    ("127.0.0.1:8080", "tcp", "127.0.0.2", 8080, (), False),
    ("127.1:80", "tcp", "127.0.0.1", 80, (), True),       # inet_aton form canonicalised
    ("2130706433:80", "tcp", "127.0.0.1", 80, (), True),
    ("0x7f.1:80", "tcp", "127.0.0.1", 80, (), True),
    ("0177.0.0.1:80", "tcp", "127.0.0.1", 80, (), True),
    ("10.0.0.0/8", "udp", "10.2.3.4", 53, (), True),
    ("10.0.0.0/8", "udp", "11.0.0.1", 53, (), False),
    ("[::1]:443", "tcp", "::1", 443, (), True),
    ("[::1]:443", "tcp", "127.0.0.1", 443, (), False),
    ("[fd00::/8]", "tcp", "fd12::1", 1, (), True),
    ("api.example.com:443", "tcp", "5.5.5.5", 443, ("api.example.com",), True),
    ("API.Example.COM.:443", "tcp", "5.5.5.5", 443, ("api.example.com",), True),
    ("api.example.com:443", "tcp", "5.5.5.5", 443, ("www.example.com",), False),
    ("*.example.com", "tcp", "5.5.5.5", 1, ("a.example.com",), True),
    ("*.example.com", "tcp", "5.5.5.5", 1, ("a.b.example.com",), True),
    ("*.example.com", "tcp", "5.5.5.5", 1, ("example.com",), False),
    ("**.example.com", "tcp", "5.5.5.5", 1, ("example.com",), True),
    ("*.example.com", "tcp", "5.5.5.5", 1, ("badexample.com",), False),
    ("icmp://10.0.0.1", "icmp", "10.0.0.1", 0, (), True),
    ("icmp://10.0.0.1", "tcp", "10.0.0.1", 0, (), False),
    ("udp://:8000-8010", "udp", "1.1.1.1", 8005, (), True),
    ("udp://:8000-8010", "udp", "1.1.1.1", 8011, (), False),
])
def test_matching(spec, proto, addr, port, names, expected):
    rule = parse_endpoint(spec)
    assert rule.matches(proto, canonical_address(addr), port, names) is expected


@pytest.mark.parametrize("spec, fragment", [
    ("", "empty endpoint"),
    ("ftp://x.com", "unknown scheme"),
    (":80,*", "'*' cannot be combined"),
    (":0", "outside 1-65535"),
    (":65536", "outside 1-65535"),
    (":http", "not a port"),
    (":90-80", "empty"),
    ("::1:443", "must be bracketed"),
    ("[::1", "unterminated"),
    ("[127.0.0.1]:80", "brackets are for IPv6"),
    ("[zz::]:80", "not an IPv6"),
    ("10.0.0.0/33", "not an IPv4 CIDR"),
    ("1.2.3.4.5", "not a valid IPv4"),
    ("*.com", "at least two labels"),
    ("**.com", "at least two labels"),
    ("a*.example.com", "whole leading label"),
    ("exa mple.com", "invalid host"),
    ("-bad.example.com", "invalid host"),
    ("bücher.example", "non-ASCII"),
    ("icmp://1.2.3.4:7", "icmp rules take no ports"),
])
def test_errors_quote_the_spec(spec, fragment):
    with pytest.raises(EndpointError) as e:
        parse_endpoint(spec)
    assert fragment in str(e.value) and repr(spec) in str(e.value)


def test_ipv4_mapped_ipv6_is_unwrapped():
    assert canonical_address("::ffff:127.0.0.3") == A("127.0.0.3")
    rule = parse_endpoint("127.0.0.1:80")
    assert not rule.matches("tcp", canonical_address("::ffff:127.0.0.3"), 80)
    assert rule.matches("tcp", canonical_address("::ffff:127.0.0.1"), 80)
