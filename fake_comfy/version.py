"""fake_comfy's own version: shown by --version, /system_stats and the web root (a module of its own, so the
server can say it without importing the package that imports the server)."""

__version__ = "0.1.0"
