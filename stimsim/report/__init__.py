"""Reports: HTML and PDF documents from Jinja2 templates, with figures embedded as PNG data URIs."""
from stimsim.report.document import Image, Listing, Paragraph, Report, Section, Table, format_value, png_data_uri
from stimsim.report.figures import figure_png, image_png

__all__ = ["Image", "Listing", "Paragraph", "Report", "Section", "Table", "figure_png", "format_value", "image_png",
           "png_data_uri"]
