"""validate's GX runtime leaves the process as it found it: GX's logger level and the pandas engine's setting."""

from __future__ import annotations

import logging

import pytest

from pipeline.errors import ValidationFailed
from pipeline.logger_levels import logger_levels
from pipeline.params import parse
from stages import validate
from stages.validate.gx_runtime import GX_LOGGERS
from tests.support.validate_corpus import GOOD_TRAIN, corpus

pytestmark = pytest.mark.e2e


def test_logger_levels_are_set_inside_the_block_and_restored_after_it_even_on_error():
    names = ("mtpipe.test.quiet", "mtpipe.test.quiet.child")
    logging.getLogger(names[0]).setLevel(logging.DEBUG)  # one set, one left unset (NOTSET)

    with pytest.raises(RuntimeError), logger_levels(names, logging.ERROR):
        assert [logging.getLogger(name).level for name in names] == [logging.ERROR, logging.ERROR]
        raise RuntimeError("inside the block")

    assert [logging.getLogger(name).level for name in names] == [logging.DEBUG, logging.NOTSET]


def test_a_validate_run_restores_the_gx_logger_and_the_fingerprint_threshold(tmp_path):
    from great_expectations.execution_engine import pandas_execution_engine

    levels = {name: logging.getLogger(name).level for name in GX_LOGGERS}
    threshold = pandas_execution_engine.HASH_THRESHOLD
    paths = corpus(tmp_path, [*GOOD_TRAIN, GOOD_TRAIN[0]])  # a duplicate: the run fails, the state still returns

    with pytest.raises(ValidationFailed):
        validate.run(parse({"validate": {"min_rows": 1}}), paths)

    assert {name: logging.getLogger(name).level for name in GX_LOGGERS} == levels
    assert pandas_execution_engine.HASH_THRESHOLD == threshold > 0
