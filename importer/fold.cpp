// placeholder, replaced by the lead's importer within the hour
