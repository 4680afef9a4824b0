"""The built-in plugins' torch models, each named by its declaration's ``model`` and imported only
when a model is built (export, train, parity), never by ``list`` or registration."""
