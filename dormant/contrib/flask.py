"""Flask: dormant configured in ``app.config``, launches tied to the Flask-SQLAlchemy session.

::

    dormant = Dormant()

    def create_app():
        app = Flask(__name__)
        app.config.from_mapping(CELERY={"broker_url": ...}, DORMANT={"SECRET_KEY": ...})
        db.init_app(app)
        celery_app = celery_init_app(app)          # the Celery app of Flask's own docs
        dormant.init_app(app, celery_app=celery_app, db=db, agents="myapp.agents")
        return app

``init_app`` installs dormant's tasks on ``celery_app`` (so ``celery -A make_celery worker``
runs the agents) and gives ``dormant.client``: wakes go through ``celery_app``, and
``launch_on_commit`` follows ``db.session``'s commit. ``app.config["DORMANT"]`` (or
``DORMANT_*`` keys) takes the names of docs/celery.md; ``DATABASE_URL`` defaults to
``SQLALCHEMY_DATABASE_URI`` and ``REDIS_URL`` to the Celery broker when it is Redis.
``init_app`` also adds ``flask dormant ...``: every ``dormant`` command, with these settings.
``dormant.stream_response(thread_id)`` serves a thread's stream as Server-Sent Events from a
view that checked the user itself (docs/streaming.md).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
from flask import Flask, Response, current_app, request
from flask.cli import with_appcontext

from dormant.contrib._settings import redis_url_of, settings_from
from dormant.contrib.sqlalchemy import session_on_commit
from dormant.errors import ConfigurationError, InvalidStreamId, UnknownThread
from dormant.settings import Settings

if TYPE_CHECKING:
    from celery import Celery
    from flask_sqlalchemy import SQLAlchemy

    from dormant.agents import AgentRegistry, AgentSource
    from dormant.client import Client

__all__ = ["Dormant", "settings_from_config"]


def settings_from_config(config: Mapping[str, Any], celery_app: Celery | None = None) -> Settings:
    """``Settings`` from a Flask config: the ``DORMANT`` dict and ``DORMANT_*`` keys."""
    values = {k.removeprefix("DORMANT_"): v for k, v in config.items() if k.startswith("DORMANT_")}
    values.update(config.get("DORMANT") or {})
    defaults: dict[str, str] = {}
    if config.get("SQLALCHEMY_DATABASE_URI"):
        defaults["DATABASE_URL"] = str(config["SQLALCHEMY_DATABASE_URI"])
    broker = celery_app.conf.broker_url if celery_app is not None else None
    if isinstance(broker, str) and broker:
        defaults["BROKER_URL"] = broker
        redis_url = redis_url_of(broker)
        if redis_url:
            defaults["REDIS_URL"] = redis_url
    return settings_from(values, defaults, "app.config['DORMANT']")


class _State:
    """One Flask app's dormant: its settings, Celery app, session, agents and (lazily)
    client."""

    def __init__(
        self,
        settings: Settings,
        celery_app: Celery | None,
        db: SQLAlchemy | None,
        agents: AgentSource,
    ):
        self.settings = settings
        self.celery_app = celery_app
        self.db = db
        self.agents = agents
        self.lock = threading.Lock()
        self.client: Client | None = None


class Dormant:
    """The Flask extension (``init_app`` pattern): one instance, any number of apps."""

    def __init__(
        self,
        app: Flask | None = None,
        *,
        celery_app: Celery | None = None,
        db: SQLAlchemy | None = None,
        agents: AgentSource = None,
    ) -> None:
        if app is not None:
            self.init_app(app, celery_app=celery_app, db=db, agents=agents)

    def init_app(
        self,
        app: Flask,
        *,
        celery_app: Celery | None = None,
        db: SQLAlchemy | None = None,
        agents: AgentSource = None,
    ) -> None:
        """Read ``app.config``; with ``celery_app``, install dormant's tasks on it; add
        ``flask dormant``. ``agents`` (else ``DORMANT["AGENTS"]``) also lets the client
        refuse a mistyped agent name at launch."""
        settings = settings_from_config(app.config, celery_app)
        if isinstance(agents, str) and not settings.agents_module:
            settings = settings.with_(agents_module=agents)  # `flask dormant launch` checks
        if celery_app is not None:
            from dormant.worker import install

            install(celery_app, agents, settings=settings)
        app.extensions["dormant"] = _State(settings, celery_app, db, agents)
        app.cli.add_command(_dormant_command(self))

    def settings(self, app: Flask | None = None) -> Settings:
        return self._state(app).settings

    def celery_app(self, app: Flask | None = None) -> Celery | None:
        """The Celery app given to ``init_app``, if any."""
        return self._state(app).celery_app

    def client(self, app: Flask | None = None) -> Client:
        """The app's ``Client`` (built on first use, shared by its requests)."""
        state = self._state(app)
        with state.lock:
            if state.client is None:
                state.client = self._build(state)
            return state.client

    def stream_response(self, thread_id: str, app: Flask | None = None) -> Response:
        """A streaming ``Response`` of ``thread_id``'s Server-Sent Events, after the request's
        ``Last-Event-ID`` header (or ``?after=``): for a view that checked the user itself.
        404 for an unknown thread, 400 for an id no stream gave out."""
        from dormant.http.stream import sse_response

        after = request.headers.get("Last-Event-ID") or request.args.get("after")
        try:
            sse = sse_response(self.client(app), thread_id, after)
        except UnknownThread:
            return Response(f"unknown thread {thread_id!r}", status=404)
        except InvalidStreamId as error:
            return Response(str(error), status=400)
        return Response(sse.body, status=sse.status, headers=sse.headers)

    def _build(self, state: _State) -> Client:
        from dormant.client import Client

        db = state.db
        on_commit = None
        if db is not None:

            def on_commit(fn: Any) -> None:
                session_on_commit(db.session)(fn)  # this request's session

        agents = _agents(state)
        if state.celery_app is not None:
            return Client.from_celery(
                state.celery_app, state.settings, agents=agents, on_commit=on_commit
            )
        return Client.from_settings(state.settings, agents=agents, on_commit=on_commit)

    def _state(self, app: Flask | None) -> _State:
        app = app or current_app
        state = app.extensions.get("dormant")
        if not isinstance(state, _State):
            raise ConfigurationError(
                f"dormant is not set up on Flask app {app.name!r}: call init_app"
            )
        return state


def _agents(state: _State) -> AgentRegistry | None:
    from dormant.agents import load_agents

    if state.agents is None and not state.settings.agents_module:
        return None  # nowhere to learn the agents: names are checked by the worker
    return load_agents(state.agents, state.settings)


def _dormant_command(extension: Dormant) -> click.Command:
    """``flask dormant ...``: the ``dormant`` command with the app's settings, so it reaches
    the app's database and broker (the plain command reads ``DORMANT_*`` variables)."""

    @click.command(
        "dormant",
        context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
        add_help_option=False,  # --help is the dormant command's
        help="dormant's command line, configured by app.config (try: flask dormant --help).",
    )
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @with_appcontext
    def dormant(args: tuple[str, ...]) -> None:
        from dormant.cli.app import run_hosted

        app = current_app._get_current_object()  # type: ignore[attr-defined]
        code = run_hosted(
            args,
            prog_name="flask dormant",
            settings=lambda: extension.settings(app),
            celery_app=extension.celery_app(app),  # wakes go where the app's workers read
        )
        if code:
            raise SystemExit(code)

    return dormant
