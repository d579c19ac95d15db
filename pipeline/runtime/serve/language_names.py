"""English names of the languages a model's directions can name, for `GET /languages` (LibreTranslate lists each
language as {"code": "en", "name": "English", ...}). The table holds the ISO 639-1 code of every language the
checkpoint families map (pipeline.runtime.families) or the clean stage knows the script of (pipeline.runtime.languages),
with the short English name ISO 639 gives it; a three-letter code is named through its ISO 639-1 code (deu: German). A
code outside the table is named by itself, so a model of another language still lists it. Stdlib only.
"""

from __future__ import annotations

from pipeline.runtime.families import ISO_639_3

ENGLISH_NAMES = {
    "af": "Afrikaans", "ar": "Arabic", "be": "Belarusian", "bg": "Bulgarian", "bn": "Bengali", "br": "Breton",
    "ca": "Catalan", "cs": "Czech", "cy": "Welsh", "da": "Danish", "de": "German", "el": "Greek", "en": "English",
    "eo": "Esperanto", "es": "Spanish", "et": "Estonian", "eu": "Basque", "fa": "Persian", "fi": "Finnish",
    "fr": "French", "ga": "Irish", "gl": "Galician", "gu": "Gujarati", "he": "Hebrew", "hi": "Hindi",
    "hr": "Croatian", "hu": "Hungarian", "hy": "Armenian", "id": "Indonesian", "is": "Icelandic", "it": "Italian",
    "ja": "Japanese", "ka": "Georgian", "kk": "Kazakh", "km": "Khmer", "ko": "Korean", "lt": "Lithuanian",
    "lv": "Latvian", "mk": "Macedonian", "ml": "Malayalam", "mn": "Mongolian", "mr": "Marathi", "ms": "Malay",
    "mt": "Maltese", "my": "Burmese", "ne": "Nepali", "nl": "Dutch", "no": "Norwegian", "pl": "Polish",
    "ps": "Pashto", "pt": "Portuguese", "ro": "Romanian", "ru": "Russian", "si": "Sinhala", "sk": "Slovak",
    "sl": "Slovenian", "sq": "Albanian", "sv": "Swedish", "sw": "Swahili", "ta": "Tamil", "te": "Telugu",
    "th": "Thai", "tl": "Tagalog", "tr": "Turkish", "uk": "Ukrainian", "ur": "Urdu", "vi": "Vietnamese",
    "xh": "Xhosa", "zh": "Chinese",
}
_ISO_639_1 = {three: two for two, three in ISO_639_3.items()}


def english_name(code: str) -> str:
    """The language's English name ("de" and "deu": German); the code itself for a language outside the table."""
    return ENGLISH_NAMES.get(_ISO_639_1.get(code, code), code)
