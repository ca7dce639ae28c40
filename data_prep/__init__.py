"""data_prep: chats -> chat template and assistant-only loss mask -> frozen target features -> sharded store.

Importing the package does nothing; entry points that compose the Hydra config call
`data_prep.resolvers.register_resolvers()` first.
"""
