"""tunnelgate runtime: entrances, the Handler, upstream pools, config API, metrics."""
