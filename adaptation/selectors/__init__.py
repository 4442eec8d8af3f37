"""Every read of day0's domain, by entity (HackSoftware's selectors): functions that take rows
or ids and return rows, querysets or plain values, with the prefetching a page needs.
"""
