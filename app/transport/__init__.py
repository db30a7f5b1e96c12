"""Getting a worker running on a node and talking to it: bootstrap, the connection, local and SSH transports."""
