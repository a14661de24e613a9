collect_ignore = ["data"]  # deliberately unsound rule fixtures, not rules to property-test
