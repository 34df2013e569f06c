"""kiln.decomp"""
