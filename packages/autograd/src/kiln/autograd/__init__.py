"""kiln.autograd"""
