"""`mtpipe serve`: the exported model (`models/export`) as an HTTP translation service on ONNX Runtime.

    settings.py   every knob and limit, checked once; errors name the command-line flag
    languages.py  the directions an export translates (its languages.json: what `/languages` lists, what a request's
                  source and target are checked on)
    engine.py     the `Translator` as the service uses it: source ids per line, a batch of ids to text
    schema.py     the JSON shapes of the API (LibreTranslate's `POST /translate {q, source, target}`)
    translate_request.py  a request body to validated lines; every bad input is an ApiError with a 4xx status
    errors.py     those errors, each with its status and a message naming the field, line or limit
    batcher.py    the queue that coalesces lines across requests into batches decoded on worker threads
    metrics.py    the Prometheus metrics of one service
    app.py        the ASGI application (FastAPI): routes, error responses, lifespan
    server.py     uvicorn around the application: binding, graceful shutdown
    child.py      `mtpipe serve` as a child process, ready to call (tests, bench/serve.py)

Needs the `serve` extra (FastAPI, uvicorn, prometheus_client); nothing here imports torch or transformers.
"""
