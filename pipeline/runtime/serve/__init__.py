"""`mtpipe serve`: the exported model (`models/export`) as an HTTP translation service on ONNX Runtime.

    settings.py   every knob and limit, checked once; errors name the command-line flag
    languages.py  the directions an export translates (its languages.json: what `/languages` lists, what a request's
                  source and target are checked on)
    engine.py     the `Translator` as the service uses it: source ids per line, a batch of ids to text
    schema.py     the shapes of the API (LibreTranslate's `/translate`, `/detect`, `/languages`) and their OpenAPI
    request_fields.py  a request's fields from JSON, an urlencoded or multipart form, or the query string
    translate_request.py  those fields to validated lines, and the translations to the answer (4xx ApiErrors)
    html_text.py  format "html": an HTML document's text nodes, and its markup kept around their translations
    detect.py     which of the model's source languages a text is in (py3langid): /detect and source "auto"
    language_names.py  the English names /languages gives the codes
    errors.py     those errors, each with its status and a message naming the field, line or limit
    batcher.py    the queue that coalesces lines across requests into batches decoded on worker threads
    metrics.py    the Prometheus metrics of one service
    app.py        the ASGI application (FastAPI): routes, error responses, lifespan
    docs.py       GET /docs: the API page, from the Swagger UI files vendored in assets/web/ (works offline)
    server.py     uvicorn around the application: binding, graceful shutdown
    http_protocol.py  uvicorn's h11 protocol with read timeouts, a connection cap and JSON for its own errors

Needs the `serve` extra (FastAPI, uvicorn, prometheus_client); nothing here imports torch or transformers.
"""
