from .common import Rule
RULES: dict[str, Rule] = {}
