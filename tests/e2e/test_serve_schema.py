"""The running `mtpipe serve` against its own OpenAPI schema: Schemathesis generates requests for every operation
/openapi.json declares (valid ones and ones that break the schema), and no answer may be a 5xx, fall outside the
statuses, content types and bodies the schema declares, or fail to come within a bound. Then the API page, /docs,
is opened in headless Chromium with the network cut off and must show every operation of that schema.

The example count per operation is bounded (EXAMPLES) so that the run stays well under a minute; it is seeded,
so a failure reproduces.
"""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode, checks  # noqa: E402

from tests.page_check import check_page, find_chromium  # noqa: E402
from tests.service_process import ServiceProcess  # noqa: E402

pytestmark = pytest.mark.e2e

EXAMPLES = 100
CALL_TIMEOUT_S = 30  # far above any answer here: a call that reaches it is a hang
LIMITS = ("--max-lines", "8", "--max-line-tokens", "64", "--max-request-bytes", "4096", "--beam", "4",
          "--request-timeout-s", "10")
CHECKS = [checks.not_a_server_error, checks.status_code_conformance, checks.content_type_conformance,
          checks.response_headers_conformance, checks.response_schema_conformance]


@pytest.fixture(scope="module")
def service(export_dir):
    with ServiceProcess(export_dir, *LIMITS) as running:
        yield running


def in_a_direction_of_the_model(case, direction: dict[str, str], replace: bool):
    """The case, with a source and target the model translates in place of the generated ones when `replace`:
    random codes are all refused (400), and the translation path would go untested."""
    for fields in (case.body, case.query):
        if replace and isinstance(fields, dict):
            fields.update({key: code for key, code in direction.items() if key in fields})
    return case


def takes_input(operation) -> bool:
    return any(len(part) for part in (operation.body, operation.query, operation.headers, operation.path_parameters,
                                       operation.cookies))


# One Hypothesis run per operation (rather than schemathesis.pytest.from_fixture, which breaks on pytest 9:
# it sets the test item's `_nodeid`, which pytest 9 no longer has).
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
def test_no_request_the_schema_allows_or_breaks_gets_a_5xx_an_undeclared_answer_or_none(service, mode):
    operations = [result.ok() for result in schemathesis.openapi.from_url(service.url + "/openapi.json")
                  .get_all_operations()]
    assert "POST /translate" in {operation.label for operation in operations}
    language = json.loads(service.get("/languages")[1])[0]
    direction = {"source": language["code"], "target": language["targets"][0]}
    for operation in operations:
        if mode is GenerationMode.NEGATIVE and not takes_input(operation):
            continue  # nothing to break


        @given(case=st.builds(in_a_direction_of_the_model, operation.as_strategy(generation_mode=mode),
                              st.just(direction), st.sampled_from([True, True, True, False])))
        @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
        def call_and_validate(case):
            case.call_and_validate(timeout=CALL_TIMEOUT_S, checks=CHECKS)

        call_and_validate()


def test_after_the_run_the_service_is_still_ready(service):
    assert service.get("/ready")[0] == 200


@pytest.mark.skipif(find_chromium() is None, reason="no Chromium (apt-get install chromium)")
def test_the_api_page_shows_every_operation_offline(service, tmp_path):
    operations = json.loads(service.get("/openapi.json")[1])["paths"]
    count = sum(len(methods) for methods in operations.values())
    shown = f"document.querySelectorAll('.opblock-summary').length === {count}"
    result = check_page(service.url + "/docs", tmp_path / "docs.png", ready_expression=shown, timeout_s=60)
    assert result.problems == [], "\n".join(result.problems)
    assert (tmp_path / "docs.png").read_bytes().startswith(b"\x89PNG")
