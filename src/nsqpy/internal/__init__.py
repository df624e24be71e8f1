"""Helpers shared by the daemons (mirrors Go nsq's internal/ packages)."""
