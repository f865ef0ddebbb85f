"""Between a master and its workers: the wire's messages, their authentication, the secrets a worker reads itself, the shared clock."""
