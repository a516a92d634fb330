"""The typed stack model: keys, stack files, validation, credentials, images, the plugin's
models from the keys, the sample catalogue."""
