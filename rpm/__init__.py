"""placeholder replaced by the core commit"""
