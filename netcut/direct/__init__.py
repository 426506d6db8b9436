"""Direct mode: netcut's worker processes enter the namespace and carry out the plan through
netlink, sysctls and a netfilter backend."""
