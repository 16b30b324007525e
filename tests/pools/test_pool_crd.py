"""The ProxyPool CRD: generated from the model, committed, and carrying the template's CEL rules."""

from __future__ import annotations

from pathlib import Path

import yaml

from stacks.crd import POOL_CRD_FILE, pool_crd, render_pool

ROOT = Path(__file__).resolve().parents[2]


def test_committed_pool_crd_is_generated() -> None:
    assert (ROOT / POOL_CRD_FILE).read_text() == render_pool(), (
        "run: python -m stacks.crd pool > " + POOL_CRD_FILE
    )


def test_pool_crd_schema_holds_the_template_rules_and_placement() -> None:
    schema = pool_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = schema["properties"]["template"]["properties"]["spec"]
    rules = [r["message"] for r in template["x-kubernetes-validations"]]
    assert "set at most one provider-type block" in rules
    cidr = template["properties"]["allowedSourceRanges"]["items"]["x-kubernetes-validations"]
    assert cidr[0]["rule"] == "isIP(self) || isCIDR(self)"
    placement = schema["properties"]["placement"]
    assert placement["minItems"] == 1
    assert placement["items"]["required"] == ["provider"]
    assert yaml.safe_load(render_pool())["metadata"]["name"] == "proxypools.crawl.example.com"
