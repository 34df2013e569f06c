"""kiln.inductor"""
