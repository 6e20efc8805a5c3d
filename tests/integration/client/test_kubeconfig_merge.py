"""``z9 clusters kubeconfig --merge`` on kubeconfigs as people have them: written by kubectl, by
hand with comments, by other tools (quoted names kubectl needs quoted — ``"y"``, ``"no"``, ``"on"``,
``"1.20"`` are booleans and numbers to its YAML 1.1 reader —, several contexts, flow style). The
merge keeps every byte of what is not z9's (comments, quotes, order), replaces z9's own entries by
name where they are, sets the current context only when asked, and the result is read back by
``kubectl config view`` (skipped without kubectl; ``Z9_REQUIRE_KUBECTL=1``, set by ``.ci/run``,
makes that a failure)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from z9.resources.cluster.client import merge_kubeconfig

FETCHED = """apiVersion: v1
kind: Config
clusters:
- name: demo
  cluster:
    server: https://203.0.113.9:6443
    certificate-authority-data: TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2sxSlNVTXZSRU5EUVdWVFowRjNTVUpCWjBsQ1FVUkJUa0puYTNGb2EybEhPWGN3UWtGUmMwWkJSRUZXVFZKTmQwVlJXVVJXVVZGRVJYZHdjbVJYU213PQ==
users:
- name: z9-admin-1
  user:
    client-certificate-data: "12345678"
    client-key-data: "1e10"
contexts:
- name: z9-admin-1@demo
  context: {cluster: demo, user: z9-admin-1}
current-context: z9-admin-1@demo
"""

# As kubectl writes it (sigs.k8s.io/yaml: keys sorted, ambiguous strings double-quoted), then
# edited by hand: comments, a context named "y" made current.
KUBECTL_WRITTEN = """# my clusters; do not lose this comment
apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: QUJD
    server: https://kind.example:6443  # the kind cluster
  name: "y"
- cluster:
    insecure-skip-tls-verify: true
    server: https://10.0.0.1:6443
  name: "1.20"
contexts:
- context:
    cluster: "y"
    namespace: "no"
    user: "on"
  name: "y"
- context:
    cluster: "1.20"
    user: "null"
  name: old
current-context: "y"
kind: Config
preferences: {}
users:
- name: "on"
  user:
    token: "true"
- name: "null"
  user:
    exec:
      apiVersion: client.authentication.k8s.io/v1beta1
      command: aws
      args: ["eks", "get-token", "--cluster-name", "prod"]
      interactiveMode: IfAvailable
      provideClusterInfo: false
"""

# Merged once before (the z9-demo entries in the middle), in another tool's layout (flow style).
MERGED_BEFORE = """apiVersion: v1
kind: Config
clusters:
- {name: first, cluster: {server: "https://192.0.2.1"}}
- name: z9-demo   # z9 put this here
  cluster: {server: "https://198.51.100.1:6443"}
- {name: last, cluster: {server: "https://192.0.2.2"}}
users:
- {name: first, user: {token: "yes"}}
- name: z9-demo
  user: {client-key-data: "old"}
contexts:
- {name: first, context: {cluster: first, user: first}}
- name: z9-demo
  context: {cluster: z9-demo, user: z9-demo}
- {name: last, context: {cluster: last, user: first}}
current-context: first
"""


def _names(doc: dict, key: str) -> list:
    return [e["name"] for e in doc.get(key) or []]


class _GoYamlV2Loader(yaml.SafeLoader):
    """PyYAML's YAML 1.1 reading, with what go-yaml v2 (kubectl's reader, ``resolve.go``) resolves
    besides: ``y``/``n`` as booleans and exponent-only numbers (``1e10``) as floats."""


_GoYamlV2Loader.add_implicit_resolver("tag:yaml.org,2002:bool", __import__("re").compile(r"^(?:y|Y|n|N)$"),
                                      list("yYnN"))
_GoYamlV2Loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                      __import__("re").compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                                      list("-+0123456789"))
_GoYamlV2Loader.add_constructor("tag:yaml.org,2002:bool",
                                lambda loader, node: loader.construct_scalar(node) in
                                ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"))


def _yaml11(text: str) -> dict:
    """As kubectl reads it: YAML 1.1 as go-yaml v2 resolves it (y, no, on booleans; 1.20, 1e10 numbers)."""
    return yaml.load(text, Loader=_GoYamlV2Loader)  # a SafeLoader subclass


def _comments(text: str) -> list[str]:
    return [line[line.index("#"):] for line in text.splitlines() if "#" in line and "#'" not in line]


@pytest.mark.parametrize("existing", [KUBECTL_WRITTEN, MERGED_BEFORE, "", None,
                                      "# only a comment\n", "apiVersion: v1\nkind: Config\n"])
@pytest.mark.parametrize("set_current", [True, False])
def test_a_merge_keeps_everything_not_z9s_and_stays_valid(existing: str | None, set_current: bool,
                                                          tmp_path: Path) -> None:
    out = merge_kubeconfig(existing, FETCHED, "z9-demo", set_current=set_current)
    doc = _yaml11(out)
    before = (_yaml11(existing) if existing else None) or {}
    for key in ("clusters", "users", "contexts"):
        entries = doc[key]
        assert all(isinstance(e["name"], str) for e in entries), (key, entries)  # "y" still a string
        others = [e for e in before.get(key) or [] if e["name"] != "z9-demo"]
        assert [e for e in entries if e["name"] != "z9-demo"] == others, key  # kept, as they were, in order
        assert _names(doc, key).count("z9-demo") == 1, key
        if "z9-demo" in _names(before, key):  # replaced where it was, not moved to the end
            assert _names(doc, key) == _names(before, key), key
    z9 = {k: next(e for e in doc[k] if e["name"] == "z9-demo") for k in ("clusters", "users", "contexts")}
    fetched = _yaml11(FETCHED)
    assert z9["clusters"]["cluster"] == fetched["clusters"][0]["cluster"]
    assert z9["users"]["user"] == fetched["users"][0]["user"]  # "12345678", "1e10": strings still
    assert z9["contexts"]["context"] == {"cluster": "z9-demo", "user": "z9-demo"}
    assert doc.get("current-context") == ("z9-demo" if set_current else before.get("current-context")), doc
    for comment in _comments(existing or ""):
        if "z9 put this here" not in comment:  # a comment on a replaced entry may go with it
            assert comment in out, (comment, out)
    if existing == KUBECTL_WRITTEN:  # the untouched part byte for byte (z9's cluster comes after it)
        assert out.startswith(existing.split("contexts:")[0]), out
        assert '  name: "y"\n' in out and 'namespace: "no"' in out and 'user: "on"' in out
    _kubectl_reads(out, doc, tmp_path)


def _kubectl_reads(text: str, doc: dict, tmp_path: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        if os.environ.get("Z9_REQUIRE_KUBECTL") == "1":
            pytest.fail("kubectl is missing; Z9_REQUIRE_KUBECTL=1 requires it (Debian: kubernetes-client)")
        return  # the YAML 1.1 reading above stands in for it
    path = tmp_path / "config"
    path.write_text(text)
    got = subprocess.run([kubectl, "config", "view", "--raw", "-o", "json"], capture_output=True, text=True,
                         env={"KUBECONFIG": str(path), "HOME": str(tmp_path), "PATH": os.environ.get("PATH", "")},
                         timeout=60, check=False)
    assert got.returncode == 0, got.stderr
    seen = json.loads(got.stdout)
    for key in ("clusters", "users", "contexts"):
        assert sorted(_names(seen, key)) == sorted(_names(doc, key)), (key, seen)
    assert seen.get("current-context", "") == (doc.get("current-context") or ""), seen
    demo = next(e for e in seen["users"] if e["name"] == "z9-demo")
    assert demo["user"]["client-key-data"] == "1e10"


def test_kubectl_refuses_what_a_yaml_1_2_dump_makes_of_a_quoted_name(tmp_path: Path) -> None:
    """Why quotes matter: the old merge (a load and dump) wrote ``name: y``, which kubectl reads as a
    boolean and refuses, the whole file with it."""
    bad = yaml.safe_dump(yaml.safe_load(KUBECTL_WRITTEN), sort_keys=False)
    assert "name: y\n" in bad
    assert not isinstance(_yaml11(bad)["contexts"][0]["name"], str)


def test_a_merge_writes_through_a_symlink_and_refuses_what_is_no_kubeconfig(tmp_path: Path) -> None:
    """``$KUBECONFIG`` a symlink (dotfiles kept elsewhere): the file it points to gets the merge,
    the link stays a link. A directory, or a file that is not UTF-8, where the kubeconfig goes:
    a clean refusal (:class:`NotAKubeconfig`), nothing written, no traceback."""
    from z9.resources.cluster.client import NotAKubeconfig, _write_private, existing_kubeconfig, kubeconfig_path

    real = tmp_path / "dotfiles" / "kubeconfig"
    real.parent.mkdir()
    real.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    link = tmp_path / "config"
    link.symlink_to(real)
    path = kubeconfig_path("z9-demo", {"KUBECONFIG": str(link)})
    _write_private(path, merge_kubeconfig(existing_kubeconfig(path), FETCHED, "z9-demo"))
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert "z9-demo" in [c["name"] for c in yaml.safe_load(real.read_text())["contexts"]]
    assert oct(real.stat().st_mode & 0o777) == "0o600"

    a_dir = tmp_path / "kube-dir"
    a_dir.mkdir()
    binary = tmp_path / "binary"
    binary.write_bytes(b"apiVersion: v1\n\xff\xfe\n")
    for bad, why in ((a_dir, "directory"), (binary, "not UTF-8")):
        path = kubeconfig_path("z9-demo", {"KUBECONFIG": str(bad)})
        assert path == bad
        with pytest.raises(NotAKubeconfig, match=why):
            existing_kubeconfig(path)
    assert binary.read_bytes() == b"apiVersion: v1\n\xff\xfe\n"
    with pytest.raises(IsADirectoryError):
        _write_private(a_dir, FETCHED)
