"""The state API and its authentication, served by fold workers."""
