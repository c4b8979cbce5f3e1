"""spark_integration"""
