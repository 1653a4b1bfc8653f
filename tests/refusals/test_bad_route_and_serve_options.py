"""Options of ``route`` and ``serve`` out of range (a constant length of 1e20, a listen port or
port base outside 1-65535): each is refused in one line naming the option, before any work."""
from __future__ import annotations

import pytest

from tests.conftest import assert_refused, run_cli

B3 = "http://127.0.0.1:1,http://127.0.0.1:2,http://127.0.0.1:3"


def test_route_constant_length_of_1e20_is_refused():
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    assert_refused(run_cli("route", "--pool", "qwen3-h100", "--backends", B3, "--router", "sfs-cc", "--listen",
                           "127.0.0.1:8200", "--lengths", "constant:1e20"), None, "--lengths", "got 1e20")


@pytest.mark.parametrize("listen,frag", [("127.0.0.1:99999", "the port must be in 1-65535"),
                                         ("127.0.0.1:0", "the port must be in 1-65535"),
                                         ("127.0.0.1:\u0661\u0662", "is not HOST:PORT")])
def test_route_listen_port_out_of_range_is_refused(listen, frag):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    assert_refused(run_cli("route", "--pool", "qwen3-h100", "--backends", B3, "--router", "sfs-cc", "--listen",
                           listen), None, "--listen", frag)


@pytest.mark.parametrize("base,frag", [("99999", "[1024, 65535]"), ("65534", "above 65535")])
def test_serve_port_base_out_of_range_is_refused(base, frag):
    pytest.importorskip("prometheus_client", reason="latroute route and serve need the serve extra, refused before their options")
    assert_refused(run_cli("serve", "--pool", "qwen3-h100", "--port-base", base), None, "--port-base", frag)
