"""A tau-bench-style retail customer-service domain (see env.py): a generated store database, the tools
the assistant calls, a customer with a request, success checked against the database's final state.
Importing this registers ``multiagent:Retail-v0`` (the assistant's side, with the scripted customer)."""

from gem_core.registry import register

register(
    "multiagent:Retail-v0",
    "gem_core.envs.retail.env:RetailAssistantEnv",
    description="tau-bench-style retail customer service: the assistant with store tools, a scripted customer; success = the final database",
)
