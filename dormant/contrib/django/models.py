"""No Django models: dormant's tables belong to its own migrations. The module exists
because Django sends ``post_migrate`` only to apps that have one."""
