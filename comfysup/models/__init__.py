"""The model manifest on a machine: pulling its files into a shared cache, verified, and showing each
server comfysup launches the files by name.

- ``cache``: the cache's layout (one file per content, ``sha256/<hex>``; partial downloads and their locks), the
  state of each entry, the folder of links by name and the ``extra_model_paths.yaml`` that points a server at it;
- ``sources``: fetching into a partial file over HTTP(S) with ``Range``, from S3, or from a local file;
- ``pull``: the pull itself (each content once, continued when interrupted, its hash checked before it is used).

The manifest itself is read and checked with the rest of the config (comfysup.config.models).
"""
