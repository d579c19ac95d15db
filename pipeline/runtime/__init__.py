"""The torch-free runtime: everything `mtpipe translate` and `mtpipe serve` need (the export format, decoding, beam
search, the Translator, checkpoint families, a model's languages, the HTTP service). It imports numpy, onnxruntime,
sentencepiece/tokenizers and the standard library, and nothing from the rest of the project (tests/unit/test_layering.py
keeps it so); the stages and tools import it."""
