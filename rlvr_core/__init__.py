"""Task, verifier, model and generation code shared by both parties.

Both target_owner_node and trainer_node import this package; neither imports the other.
"""
