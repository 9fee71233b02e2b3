"""Object storage: where outputs and input files live when they are not on one machine's disk.

``s3`` is the one S3-compatible client every layer shares (the runner's uploads, the doors' presigned URLs,
prune's deletes, the asset store, inputs fetched from ``s3://``): built from a config section, with the errors
of the service sorted into "try again later" and "the config is wrong".
"""
