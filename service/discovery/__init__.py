"""Discovery: lease healthy proxies with cooldowns, penalties, sticky sessions, in memory or in Redis."""
