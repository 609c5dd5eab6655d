"""`mlx-spec serve`: a server over one Engine that speaks OpenAI's chat completions and Responses
API and Anthropic's Messages API, with a prompt cache and a page that shows every token's
probability.

app.py: the app and its error handlers; gate.py: what every route checks (key, model, media,
the prompt's tokens); body.py: reading a request body strictly; schemas.py: chat and completion
requests, and errors; names.py: the names the model answers to; generation.py: a request's
prompt tokens, and what it does on the model's thread; streaming.py: a job's events as an HTTP
answer; worker.py: the scheduler in front of the model (admission.py: whether a row's K/V fit;
agreement.py: its decisions followed by a group's other ranks). Per dialect, its routes, its requests
translated to a chat request, and its answer objects and events:
- chat completions and completions: openai_routes.py, schemas.py, chat_objects.py;
- the Responses API: responses_routes.py, responses_api.py, responses_events.py;
- the Messages API: messages_routes.py, messages_api.py, messages_events.py.
static/: the page (plain HTML, CSS and JavaScript: offline, no build step).
"""

import socket
from typing import Any, Callable, Optional, Sequence

from ..errors import GroupError, SettingsError
from ..options import Options
from .app import create_app
from .worker import Worker

__all__ = ["create_app", "serve", "Worker"]


def serve(load: Callable[[], Any], model_id: str, defaults: Options, host: str = "127.0.0.1", port: int = 8080,
          api_key: Optional[str] = None, cache_gb: float = 4.0, max_batch: int = 8, log_level: str = "info",
          served_names: Sequence[str] = (), allow_files: bool = False, allow_fetch: bool = False,
          any_model: bool = False) -> None:
    """Load the engine (`load()`, on the model's thread) and serve it until Ctrl-C (or SIGTERM):
    running answers are stopped, the model's thread ends, and the call returns."""
    import uvicorn

    check_listening(host, port)  # before minutes of loading
    worker = Worker(load, int(cache_gb * 1e9), max_batch)
    app = create_app(worker, model_id, defaults, api_key, served_names=served_names, allow_files=allow_files,
                     allow_fetch=allow_fetch, any_model=any_model)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            worker.end_all()  # answers end now, instead of after the graceful-shutdown timeout
            super().handle_exit(sig, frame)

    server = Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5))
    worker.on_broken_group = lambda: setattr(server, "should_exit", True)  # (its 503s are sent first)
    if worker.broken_group:  # (it broke before the callback was set)
        server.should_exit = True
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises the caught signal again once it has shut down
        pass
    except SystemExit:  # uvicorn's own exit where it could not start (it logged why)
        if server.started:
            raise
        raise SettingsError(f"the server could not start on {host}:{port} (uvicorn's message is above)") from None
    finally:
        worker.close()
    if worker.broken_group:
        raise GroupError(f"{worker.down}; rank 0 ends, so that the other ranks, which may wait for it in a "
                         "collective, end too")


def check_listening(host: str, port: int) -> None:
    """A SettingsError naming why the server could not listen on host:port (a name that does not
    resolve, an address of no interface here, a port taken), found by binding it for a moment
    (with SO_REUSEADDR, as uvicorn binds)."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        raise SettingsError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
