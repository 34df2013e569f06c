"""kiln.capture"""
