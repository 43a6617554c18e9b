"""The web console at ``/console``: server-rendered pages (Jinja2, autoescaped) plus a vendored htmx.

:mod:`.routes` holds the router (included by ``functions/api/handler.py`` like the JSON routers),
:mod:`.render` the templates' environment, the security headers and the CSRF check; ``templates/`` and
``static/`` ship with the package (htmx pinned, with its licence).
"""
