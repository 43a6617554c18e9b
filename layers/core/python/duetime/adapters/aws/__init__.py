"""The AWS adapter set: the only modules that hold DynamoDB expressions, attribute-value dicts and SDK error codes."""
