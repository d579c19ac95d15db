"""pipeline/runtime/serve/detect.py and `source: "auto"`: a text's language is detected (py3langid) among the model's
sources, with LibreTranslate's confidence in percent; "auto" translates each item of `q` from the source found
among those that go into the target, also on a model of several sources, and says so in detectedLanguage."""

from __future__ import annotations

import pytest

from pipeline.runtime.languages import Direction, Directions
from pipeline.runtime.serve import detect
from pipeline.runtime.serve.errors import BadRequest, OverLimit
from pipeline.runtime.serve.languages import ServedLanguages
from pipeline.runtime.serve.schema import DetectRequest, TranslateRequest
from pipeline.runtime.serve.settings import ServeSettings
from pipeline.runtime.serve.translate_request import detections, prepare

ENGLISH = "A man in a blue shirt is standing on a ladder."
GERMAN = "Ein Mann in einem blauen Hemd steht auf einer Leiter."
FRENCH = "Un homme en chemise bleue est debout sur une échelle."
SETTINGS = ServeSettings(model_dir="unused", max_lines=4)


class SourceMarkingEngine:
    """Tokenizes a line as its source language's first letter (negated), then one id per character."""

    max_line_tokens = 100
    beam = 2

    def __init__(self, directions: tuple[str, ...]):
        self.languages = ServedLanguages(Directions.of(directions))

    def source_ids(self, line: str, direction: Direction) -> list[int]:
        return [-ord(direction.src[0]), *map(ord, line)]


def test_the_language_a_text_is_in_ranks_first_with_a_confidence_in_percent():
    english, german = detect.rank([ENGLISH], ["de", "en"])
    assert english.language == "en" and 90 <= english.confidence <= 100
    assert german.language == "de" and 0 <= german.confidence < 5
    assert detect.rank([GERMAN], ["en", "de"])[0].language == "de"


def test_a_source_py3langid_does_not_know_has_no_confidence_and_a_list_is_detected_as_one_text():
    assert [d.language for d in detect.rank([ENGLISH], ["zz", "en"])] == ["en", "zz"]
    assert detect.rank([ENGLISH], ["zz"])[0].confidence == 0
    # Weighted by length: the long English text outweighs the short German one.
    together = detect.rank([ENGLISH * 3, "Ein Hund."], ["de", "en"])
    assert together[0].language == "en"
    assert detect.rank(["Ein Hund."], ["de", "en"])[0].language == "de"


def test_auto_translates_each_item_from_the_source_detected_among_those_into_the_target():
    engine = SourceMarkingEngine(("en-fr", "de-fr", "en-de"))
    request = TranslateRequest(q=[ENGLISH, GERMAN], source="auto", target="fr")
    prepared = prepare(request, engine, SETTINGS)
    assert [ids[0] for ids in prepared.sources] == [-ord("e"), -ord("d")]
    answer = prepared.response(["un", "deux"])
    assert answer["translatedText"] == ["un", "deux"]
    assert [d["language"] for d in answer["detectedLanguage"]] == ["en", "de"]
    # Into de only en goes: German text is translated from en, and the answer says how unlikely that is.
    single = prepare(TranslateRequest(q=GERMAN, source="auto", target="de"), engine, SETTINGS)
    assert single.sources[0][0] == -ord("e")
    detected = single.response(["x"])["detectedLanguage"]
    assert detected["language"] == "en" and detected["confidence"] < 5


def test_a_named_source_gives_no_detected_language_and_an_unknown_target_is_refused_also_with_auto():
    engine = SourceMarkingEngine(("en-de",))
    assert prepare(TranslateRequest(q=ENGLISH, source="en", target="de"), engine, SETTINGS).response(["x"]) == {
        "translatedText": "x"}
    with pytest.raises(BadRequest) as caught:
        prepare(TranslateRequest(q=ENGLISH, source="auto", target="fr"), engine, SETTINGS)
    assert caught.value.message == "target 'fr' is not one of this model's targets: de (directions: en-de)"


def test_detect_answers_the_models_sources_best_first_at_most_three():
    engine = SourceMarkingEngine(("en-de", "fr-de", "de-en", "cs-de"))
    answer = detections(DetectRequest(q=FRENCH), engine, SETTINGS)
    assert [d["language"] for d in answer][0] == "fr" and len(answer) == 3
    assert all(set(d) == {"confidence", "language"} and 0 <= d["confidence"] <= 100 for d in answer)
    assert [d["confidence"] for d in answer] == sorted((d["confidence"] for d in answer), reverse=True)
    assert detections(DetectRequest(q=[GERMAN, GERMAN]), engine, SETTINGS)[0]["language"] == "de"


def test_detect_refuses_what_translate_refuses_naming_the_line_or_the_limit():
    engine = SourceMarkingEngine(("en-de",))
    with pytest.raises(OverLimit) as caught:
        detections(DetectRequest(q=["a\nb", "c\nd\ne"]), engine, SETTINGS)
    assert caught.value.message.startswith("q has 5 lines")
    with pytest.raises(BadRequest) as caught:
        detections(DetectRequest(q="ok\nA \udfff"), engine, SETTINGS)
    assert caught.value.message == "q is not valid Unicode: an unpaired surrogate \\udfff at line 2 column 3"
