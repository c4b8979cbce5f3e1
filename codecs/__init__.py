"""codecs"""
