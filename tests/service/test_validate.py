"""`proxy-operator validate`: the common mistakes each give file, object, field path and what to do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.validate import validate_manifests
from stacks.problems import Problem

ROOT = Path(__file__).resolve().parents[2]
# Folders of manifests (examples/ci holds CI recipes, not manifests).
EXAMPLES = sorted(
    p
    for p in (ROOT / "examples").iterdir()
    if p.is_dir() and any(re.search(r"^kind: Proxy$", f.read_text(), re.M) for f in p.glob("*.yaml"))
)

CATALOGUE = """\
providers:
  - name: local
    type: local
  - name: kvm-home
    type: kvm
    hosts:
      - name: kvm1
        uri: qemu+ssh://virt@kvm1.lan/system
"""


def proxy(name: str, spec: str) -> str:
    indented = "".join(f"  {line}\n" for line in spec.splitlines())
    return (
        "apiVersion: crawl.example.com/v1alpha1\nkind: Proxy\n"
        f"metadata:\n  name: {name}\n  namespace: crawl\nspec:\n{indented}"
    )


def write(tmp_path: Path, *, proxies: list[str], catalogue: str = CATALOGUE) -> Path:
    (tmp_path / "catalogue.yaml").write_text(catalogue)
    (tmp_path / "proxies.yaml").write_text("---\n".join(proxies))
    return tmp_path


def only_problem(directory: Path) -> Problem:
    problems = validate_manifests(directory).problems
    assert len(problems) == 1, [str(p) for p in problems]
    return problems[0]


GOOD = "provider: local\nport: 18081\nallowedSourceRanges: [127.0.0.0/8]"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_folder_validates(example: Path) -> None:
    report = validate_manifests(example)
    assert report.problems == []
    assert report.proxies >= 2
    assert report.providers == 1


def test_local_example_has_three_loopback_proxies_with_generated_credentials() -> None:
    from stacks.manifests import load_manifests

    found = load_manifests(ROOT / "examples" / "local")
    assert found.catalogue is not None
    assert [(e.name, e.type) for e in found.catalogue.providers] == [("local", "local")]
    specs = [p.obj.spec for p in found.proxies]
    assert [s.port for s in specs] == [18081, 18082, 18083]
    assert {(s.provider, s.auth.mode, s.block_for("local").bind_address) for s in specs} == {
        ("local", "generated", "127.0.0.1")
    }


def test_provider_name_not_dns1123(tmp_path: Path) -> None:
    problem = only_problem(
        write(tmp_path, proxies=[], catalogue="providers:\n  - name: Local_1\n    type: local\n")
    )
    assert problem.file.endswith("catalogue.yaml")
    assert problem.line == 2
    assert problem.obj == "provider Local_1"
    assert problem.path == "providers[0].name"
    assert "not a DNS-1123 label: use lowercase letters" in problem.message


def test_unknown_provider(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path, proxies=[proxy("web-1", GOOD.replace("local", "locl", 1))]))
    assert (problem.obj, problem.path, problem.line) == ("Proxy crawl/web-1", "spec.provider", 7)
    assert problem.file.endswith("proxies.yaml")
    assert (
        "no provider named 'locl' in the catalogue (known: local, kvm-home): fix the name" in problem.message
    )


def test_port_out_of_range(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path, proxies=[proxy("web-1", GOOD.replace("18081", "70000"))]))
    assert (problem.obj, problem.path) == ("Proxy crawl/web-1", "spec.port")
    assert "less than or equal to 65535, got 70000: lower it into the allowed range" in problem.message


def test_open_proxy_without_credentials(tmp_path: Path) -> None:
    spec = "provider: local\nauth: {mode: none}\nallowedSourceRanges: [0.0.0.0/0]"
    problem = only_problem(write(tmp_path, proxies=[proxy("open-1", spec)]))
    assert (problem.obj, problem.path) == ("Proxy crawl/open-1", "spec.allowedSourceRanges")
    assert "open proxies get abused within hours; set auth.mode" in problem.message


def test_open_proxy_without_any_ranges(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path, proxies=[proxy("open-2", "provider: local\nauth: {mode: none}")]))
    assert problem.path == "spec.allowedSourceRanges"
    assert "open proxies get abused" in problem.message


def test_duplicate_catalogue_name(tmp_path: Path) -> None:
    catalogue = CATALOGUE + "  - name: local\n    type: local\n"
    problem = only_problem(write(tmp_path, proxies=[proxy("web-1", GOOD)], catalogue=catalogue))
    assert (problem.obj, problem.path) == ("catalogue", "providers")
    assert "providers[0] and providers[2] are both named 'local': names must be unique, rename one" in (
        problem.message
    )


def test_kvm_host_missing_from_catalogue(tmp_path: Path) -> None:
    spec = "provider: kvm-home\nkvm: {host: kvm9}"
    problem = only_problem(write(tmp_path, proxies=[proxy("home-1", spec)]))
    assert (problem.obj, problem.path, problem.line) == ("Proxy crawl/home-1", "spec.kvm.host", 8)
    assert "host 'kvm9' is not in provider 'kvm-home' (hosts: kvm1): use one of them" in problem.message


def test_block_must_match_the_provider_type(tmp_path: Path) -> None:
    problem = only_problem(write(tmp_path, proxies=[proxy("web-1", GOOD + "\ngcp: {preemptible: true}")]))
    assert problem.path == "spec.gcp"
    assert "of type local, this block is for gcp: move the settings to spec.local" in problem.message


def test_duplicate_proxy_and_local_port_clash(tmp_path: Path) -> None:
    clash = GOOD + "\nlocal: {bindAddress: 0.0.0.0}"
    directory = write(
        tmp_path,
        proxies=[proxy("web-1", GOOD), proxy("web-1", GOOD.replace("1\n", "2\n")), proxy("web-3", clash)],
    )
    messages = [(p.obj, p.path, p.message) for p in validate_manifests(directory).problems]
    assert [m[:2] for m in messages] == [
        ("Proxy crawl/web-1", "metadata.name"),
        ("Proxy crawl/web-3", "spec.port"),
    ]
    assert "also defined in" in messages[0][2]
    assert "port 18081 on 0.0.0.0 is also used by Proxy crawl/web-1: pick another port" in messages[1][2]


def test_missing_catalogue(tmp_path: Path) -> None:
    (tmp_path / "proxies.yaml").write_text(proxy("web-1", GOOD))
    problem = only_problem(tmp_path)
    assert (
        "no provider catalogue found: add a YAML file with a top-level `providers:` list" in problem.message
    )


def test_cli_exit_codes_and_output(tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(app, ["validate", "--manifests", str(ROOT / "examples" / "local")])
    assert good.exit_code == 0, good.output
    assert good.output.strip().splitlines() == [
        f"{ROOT / 'examples' / 'local'}: 3 Proxies, 1 provider: valid"
    ]
    directory = write(
        tmp_path, proxies=[proxy("web-1", GOOD.replace("18081", "0")), proxy("web-2", "port: 1")]
    )
    bad = runner.invoke(app, ["validate", "--manifests", str(directory)])
    assert bad.exit_code == 1
    lines = bad.output.strip().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{directory / 'proxies.yaml'}:8 (document 1) Proxy crawl/web-1 spec.port: ")
    assert " Proxy crawl/web-2 spec.provider: Field required: add this field" in lines[1]
    assert lines[2].endswith("2 problems")


def test_not_a_directory(tmp_path: Path) -> None:
    problem = only_problem(tmp_path / "nope")
    assert "is not a directory" in problem.message


def test_duplicate_catalogue_name_is_reported_beside_other_entry_errors(tmp_path: Path) -> None:
    catalogue = CATALOGUE + "  - name: local\n    type: local\n  - name: bad_name\n    type: local\n"
    problems = validate_manifests(write(tmp_path, proxies=[], catalogue=catalogue)).problems
    assert [(p.obj, p.path) for p in problems] == [
        ("catalogue", "providers"),
        ("provider bad_name", "providers[3].name"),
    ]
    assert "providers[0] and providers[2] are both named 'local'" in problems[0].message


def test_a_misspelt_kind_fails_validation_with_the_hint(tmp_path: Path) -> None:
    good = proxy("web-1", GOOD)
    directory = write(
        tmp_path,
        proxies=[
            good,
            proxy("web-2", GOOD.replace("18081", "18082")).replace("kind: Proxy", "kind: proxy"),
            proxy("web-3", GOOD.replace("18081", "18083")).replace("v1alpha1", "v1"),
            proxy("web-4", GOOD.replace("18081", "18084")).replace("example.com", "example.con"),
        ],
    )
    result = CliRunner().invoke(app, ["validate", "--manifests", str(directory)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 4, lines
    file = directory / "proxies.yaml"
    assert lines[0] == (
        f'{file}:12 (document 2) document kind: kind "proxy" with apiVersion crawl.example.com/v1alpha1 is '
        'not a kind of crawl.example.com (did you mean "Proxy"?); nothing is deleted until this is fixed'
    )
    for line, document in zip(lines[1:3], ("(document 3)", "(document 4)"), strict=True):
        assert document in line
        assert "did you mean crawl.example.com/v1alpha1?" in line
    assert lines[3].endswith("1 Proxy, 2 providers: 3 problems")
