"""pager"""
