"""Reading pi session files and publishing their entries to Kafka."""
