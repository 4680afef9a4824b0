"""Batch jobs over files: the resumable file translation and its Ray Data actor pool."""
