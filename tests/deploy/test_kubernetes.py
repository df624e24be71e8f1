"""deploy/kubernetes/: schema-valid manifests (kubernetes-validate's bundled OpenAPI schemas,
strict: an unknown or misspelt field fails), the shape docs/operations.md promises, and each
container's command line run as written.

The containers run as local processes that resolve the manifests' DNS names through their own
/etc/hosts (tests/hosts_namespace.py), so ``nsqlookupd-0.nsqlookupd`` and the name nsqd
registers (``nsqd-0.nsqd.default.svc``) work as they would in the cluster. Replaced: the listen
addresses (free loopback ports) and the data path; the names' ports follow the listen ports.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from nsqpy.internal.durations import parse_duration
from nsqpy.testing import DaemonProcess

from ..hosts_namespace import HostsFile
from ..raw_v2 import NsqConn, wait_until
from .support import BIN, EXPECT, KUBERNETES, CommandDaemon, get, get_json, post

#: the Kubernetes release whose schemas the manifests are checked against (any bundled one
#: from 1.25 on accepts them; the oldest still supported upstream when this was written)
KUBERNETES_VERSION = "1.30.0"
NAMESPACE = "default"


def documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted(KUBERNETES.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def workload(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def container(kind: str, name: str) -> dict[str, Any]:
    (only,) = workload(kind, name)["spec"]["template"]["spec"]["containers"]
    return dict(only)


def flag(argv: list[str], name: str) -> list[str]:
    return [a.partition("=")[2] for a in argv if a.startswith(f"--{name}=")]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_manifest_is_schema_valid(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_manifests_have_the_promised_shape() -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in documents())
    assert kinds == [
        ("Deployment", "nsqadmin"),
        ("Service", "nsqadmin"),
        ("Service", "nsqd"),
        ("Service", "nsqlookupd"),
        ("StatefulSet", "nsqd"),
        ("StatefulSet", "nsqlookupd"),
    ]
    for kind, name in (("StatefulSet", "nsqd"), ("StatefulSet", "nsqlookupd")):
        assert workload(kind, name)["spec"]["serviceName"] == name
    for kind, name in kinds:
        if kind == "Service":
            continue
        spec = workload(kind, name)["spec"]
        pod = spec["template"]
        # the Service selects these pods, and its target ports are the container's ports
        service = workload("Service", name)["spec"]
        assert service["selector"].items() <= pod["metadata"]["labels"].items()
        assert spec["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        box = container(kind, name)
        ports = {p["name"]: p["containerPort"] for p in box["ports"]}
        assert {p["targetPort"] for p in service["ports"]} <= set(ports)
        probe = box["readinessProbe"]["httpGet"]
        assert (probe["path"], ports[probe["port"]]) == ("/ping", ports["http"])

    nsqd = workload("StatefulSet", "nsqd")["spec"]
    box = container("StatefulSet", "nsqd")
    argv = box["command"] + box["args"]
    (claim,) = nsqd["volumeClaimTemplates"]
    (mount,) = box["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert flag(argv, "data-path") == [mount["mountPath"]]
    assert "storage" in claim["spec"]["resources"]["requests"]
    (drain,) = flag(argv, "drain-timeout")
    grace = nsqd["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= parse_duration(drain) + 15
    assert "kill -TERM 1" in " ".join(box["lifecycle"]["preStop"]["exec"]["command"])


# --------------------------------------------------------------------------- run as written


def as_written(box: dict[str, Any], pod: str, listen: dict[str, str], **extra: str) -> list[str]:
    """The container's command and args with $(VAR) from its fieldRef env filled in for
    ``pod``, its listen flags replaced by ``listen`` and ``extra`` substitutions applied."""
    values = {"metadata.name": pod, "metadata.namespace": NAMESPACE}
    env = {e["name"]: values[e["valueFrom"]["fieldRef"]["fieldPath"]] for e in box.get("env", [])}
    argv = [str(BIN / box["command"][0]), *box["command"][1:]]
    for arg in box["args"]:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        name = arg.partition("=")[0].lstrip("-")
        if name in listen:
            arg = f"--{name}={listen[name]}"
        for old, new in extra.items():
            arg = arg.replace(old, new)
        argv.append(arg)
    return argv


@pytest.mark.root
def test_containers_run_as_written_and_nsqd_drains_in_pre_stop(
    daemons: list[DaemonProcess], tmp_path: Path
) -> None:
    local = {"tcp-address": "127.0.0.1:0", "http-address": "127.0.0.1:0"}
    lookupd = CommandDaemon(
        as_written(container("StatefulSet", "nsqlookupd"), "nsqlookupd-0", local),
        EXPECT["nsqlookupd"],
    )
    daemons.append(lookupd.start())
    # One nsqlookupd here: the other two names lead where nothing listens (::1), so those
    # peers fail as a lookupd that is down would, and no name is ever asked of a DNS server.
    names = {"nsqlookupd-0.nsqlookupd": "127.0.0.1"}
    names |= {f"nsqlookupd-{i}.nsqlookupd": "::1" for i in (1, 2)}
    names["nsqd-0.nsqd.default.svc"] = "127.0.0.1"
    hosts = HostsFile(tmp_path / "hosts", names)
    lookupd_ports = {":4160": f":{lookupd.tcp_port}", ":4161": f":{lookupd.http_port}"}
    nsqd_box = container("StatefulSet", "nsqd")
    nsqd = CommandDaemon(
        as_written(nsqd_box, "nsqd-0", local, **lookupd_ports, **{"=/data": f"={tmp_path}"}),
        EXPECT["nsqd"],
        wrap=hosts.wrap,
    )
    daemons.append(nsqd.start())
    admin = CommandDaemon(
        as_written(
            container("Deployment", "nsqadmin"),
            "nsqadmin-x",
            {"http-address": "127.0.0.1:0"},
            **lookupd_ports,
        ),
        EXPECT["nsqadmin"],
        wrap=hosts.wrap,
    )
    daemons.append(admin.start())
    for daemon in (lookupd, nsqd, admin):
        assert get(daemon, "/ping") == (200, b"OK")  # the readiness probe

    post(nsqd, "/topic/create?topic=in_cluster")
    nodes = wait_until(
        lambda: get_json(lookupd, "/nodes")["producers"], what="nsqd registered", timeout=15.0
    )
    assert [n["broadcast_address"] for n in nodes] == ["nsqd-0.nsqd.default.svc"]
    # nsqadmin reaches nsqd by the name it registered, as it would in the cluster
    topic = wait_until(
        lambda: get_json(admin, "/api/topics/in_cluster")["nodes"],
        what="nsqadmin sees nsqd",
        timeout=15.0,
    )
    assert topic[0]["node"] == f"nsqd-0.nsqd.default.svc:{nsqd.http_port}"

    # preStop: the hook as written, aimed at this nsqd rather than the container's PID 1
    NsqConn(nsqd.tcp_address).mpub("in_cluster", [b"a", b"b"])
    consumer = NsqConn(nsqd.tcp_address)
    consumer.sub("in_cluster", "work")
    script = nsqd_box["lifecycle"]["preStop"]["exec"]["command"]
    hook_script = re.sub(r"(kill -\w+) 1\b", rf"\1 {nsqd.pid}", script[-1])
    hook = subprocess.Popen([*script[:-1], hook_script])
    wait_until(lambda: get(nsqd, "/ping") == (503, b"DRAINING"), what="draining", timeout=15.0)
    consumer.rdy(2)
    for _ in range(2):
        consumer.fin(consumer.expect_message().id)
    assert nsqd.proc is not None and nsqd.proc.wait(30) == 0
    # the hook returns once nsqd is gone (here: reaped; in a pod: PID 1 exited)
    assert hook.wait(5) == 0
    assert "NSQ: drained - all channels empty" in nsqd.log
